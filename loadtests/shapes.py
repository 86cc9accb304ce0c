"""`ProfileShape`: a Locust load shape whose stages come from a profile file (see profiles.py)."""
from __future__ import annotations

from locust import LoadTestShape

from zerocheck.loadtests.options import load_options


class ProfileShape(LoadTestShape):
    """Users per stage of `--load-profile` (scaled by --profile-users/--profile-duration); None after the last
    stage, so a headless run stops by itself."""

    def tick(self) -> tuple[int, float] | None:
        stage = load_options(self.runner.environment).profile.stage_at(self.get_run_time())
        return None if stage is None else (stage.users, stage.spawn_rate)
