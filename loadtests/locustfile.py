"""Locust entry point for zerocheck: gRPC, HTTP, OpenAI-API and Anthropic-API streaming users, a profile-driven shape, the request log.

  python -m locust -f loadtests/locustfile.py --headless --load-profile ramp --zerocheck ab
(or `zerocheck load`, which also writes the summary). Options: zerocheck.loadtests.options."""
import logging
from pathlib import Path

import gevent
import grpc.experimental.gevent as grpc_gevent
from locust import events, stats
from locust.env import Environment
from locust.runners import WorkerRunner

from zerocheck.loadtests.options import add_locust_options, load_options
from zerocheck.loadtests.profiles import ProfileError
from zerocheck.loadtests.request_log import RequestLog
from zerocheck.loadtests.shapes import ProfileShape
from zerocheck.loadtests.targets import RemoteTargetRefused
from zerocheck.loadtests.users import AnthropicStreamUser, GrpcStreamUser, HttpStreamUser, OpenAIStreamUser

grpc_gevent.init_gevent()  # gRPC's C core must yield to gevent (Locust has monkey-patched the process)

__all__ = ["AnthropicStreamUser", "GrpcStreamUser", "HttpStreamUser", "OpenAIStreamUser", "ProfileShape"]


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    add_locust_options(parser)


@events.init.add_listener
def _on_init(environment: Environment, **_) -> None:
    try:
        load_options(environment)  # refuses remote targets and bad profiles before any user starts
    except (RemoteTargetRefused, ProfileError) as error:
        logging.error("%s", error)
        raise SystemExit(2) from None
    if environment.parsed_options.request_log:
        log = RequestLog(Path(environment.parsed_options.request_log))
        environment.events.request.add_listener(log.on_request)
        environment.events.quitting.add_listener(log.close)


@events.test_stop.add_listener
def _let_csv_catch_up(environment: Environment, **_) -> None:
    """Locust rewrites the CSV stats once a second and only closes the files at exit: wait for one more pass, so
    the requests that finished while users stopped are in locust_stats.csv too."""
    if not isinstance(environment.runner, WorkerRunner):
        gevent.sleep(stats.CSV_STATS_INTERVAL_SEC + 0.5)
