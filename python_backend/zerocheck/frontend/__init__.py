"""zerocheck's HTTP front end: one aiohttp process in front of tritonserver.

- The OpenAI-compatible API (`/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/health`,
  `/metrics`), served over one shared gRPC channel to the `generate` model (openai_routes.py), and on
  the same port Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`:
  anthropic_routes.py); path.py says which sampler path a request asks for and which served it.
- The guarded door to Triton's own HTTP API (door.py): Triton's HTTP endpoint binds an internal
  loopback port, and every public HTTP request passes through body, header and time limits first.

`zerocheck serve` starts it beside tritonserver (`zerocheck.serve.stack`); `zerocheck openai` runs
it alone against a server elsewhere.
"""
