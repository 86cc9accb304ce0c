"""Locust entry point for zerocheck: gRPC and HTTP streaming users, a profile-driven shape, the request log.

  python -m locust -f loadtests/locustfile.py --headless --load-profile ramp --zerocheck ab
(or `zerocheck load`, which also writes the summary). Options: zerocheck.loadtests.options."""
import logging
from pathlib import Path

import grpc.experimental.gevent as grpc_gevent
from locust import events
from locust.env import Environment

from zerocheck.loadtests.options import add_locust_options, load_options
from zerocheck.loadtests.profiles import ProfileError
from zerocheck.loadtests.request_log import RequestLog
from zerocheck.loadtests.shapes import ProfileShape
from zerocheck.loadtests.targets import RemoteTargetRefused
from zerocheck.loadtests.users import GrpcStreamUser, HttpStreamUser

grpc_gevent.init_gevent()  # gRPC's C core must yield to gevent (Locust has monkey-patched the process)

__all__ = ["GrpcStreamUser", "HttpStreamUser", "ProfileShape"]


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
