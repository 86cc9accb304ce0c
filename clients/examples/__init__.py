"""Runnable client examples that check their own output (`python -m zerocheck.clients.examples.stream_sync`)."""
