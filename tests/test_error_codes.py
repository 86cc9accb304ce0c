"""Error codes: every server error message starts with its code, and the clients type errors by it."""
from __future__ import annotations

import pytest

from zerocheck.api.errors import (Cancelled, ErrorCode, InternalError, InvalidRequest, Overloaded, Unavailable,
                                  classify, coded_message, error_from_message, parse_code)
from zerocheck.clients import errors as client_errors
from zerocheck.sampling import SamplingParamError

CASES = [(InvalidRequest("top_p must be in (0, 1], got 1.5"), ErrorCode.INVALID_ARGUMENT, 400),
         (SamplingParamError("temperature must be finite, got nan"), ErrorCode.INVALID_ARGUMENT, 400),
         (Overloaded("overloaded: 16/16 sequences active; retry later"), ErrorCode.RESOURCE_EXHAUSTED, 429),
         (Unavailable("decoder is not ready"), ErrorCode.UNAVAILABLE, 503),
         (Cancelled("cancelled by the client"), ErrorCode.CANCELLED, 499),
         (InternalError("the decoder's forward failed"), ErrorCode.INTERNAL, 500)]


@pytest.mark.parametrize("error, code, status", CASES, ids=[c[1].value + str(i) for i, c in enumerate(CASES)])
def test_each_error_has_its_code_first(error, code, status):
    assert classify(error) == (code, str(error))
    text = coded_message(error)
    assert text == f"{code.value}: {error}"
    assert parse_code(text) == (code, str(error))
    back = error_from_message(text)
    assert back.code is code and str(back) == str(error)
    assert code.http_status == status


def test_an_unexpected_error_is_internal_and_hides_its_detail(caplog):
    code, message = classify(KeyError("/secret/path"))
    assert code is ErrorCode.INTERNAL and message == "internal error (KeyError); see the server log"
    assert "secret" not in message and "internal error" in caplog.text


def test_triton_codes_and_retryability():
    assert ErrorCode.RESOURCE_EXHAUSTED.triton_code == "UNAVAILABLE"  # 2.51 models cannot raise it: the text tells
    assert ErrorCode.INVALID_ARGUMENT.triton_code == "INVALID_ARG"
    assert {c for c in ErrorCode if c.retryable} == {ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.UNAVAILABLE}
    assert parse_code("in ensemble 'x', INVALID_ARGUMENT: y") == (None, "in ensemble 'x', INVALID_ARGUMENT: y")
    assert parse_code("NOT_A_CODE: text") == (None, "NOT_A_CODE: text")


@pytest.mark.parametrize("code, kind", [(ErrorCode.INVALID_ARGUMENT, client_errors.InvalidRequest),
                                        (ErrorCode.RESOURCE_EXHAUSTED, client_errors.Unavailable),
                                        (ErrorCode.UNAVAILABLE, client_errors.Unavailable),
                                        (ErrorCode.CANCELLED, client_errors.Cancelled),
                                        (ErrorCode.INTERNAL, client_errors.ZerocheckError)])
def test_clients_type_errors_by_code_on_every_wire(code, kind):
    text = f"{code.value}: something happened"
    for error in (client_errors.error_from_message(text),  # a gRPC stream error: no status
                  client_errors.error_from_message(f"in ensemble 'ensemble', {text}"),
                  client_errors.error_from_grpc("StatusCode.UNAVAILABLE", text),  # the status Triton 2.51 sets
                  client_errors.error_from_http(code.http_status, text),
                  client_errors.error_from_http(503, text, "2")):
        assert type(error) is kind and error.code is code and error.message == "something happened"
        assert error.retryable == code.retryable


def test_clients_fall_back_to_the_transport_status_without_a_code():
    assert type(client_errors.error_from_message("unexpected inference input 'colour'")) is client_errors.InvalidRequest
    assert type(client_errors.error_from_grpc("DEADLINE_EXCEEDED", "deadline")) is client_errors.Timeout
    assert client_errors.error_from_http(429, "slow down", "1.5").retry_after_s == 1.5
    other = client_errors.error_from_http(418, "teapot")
    assert type(other) is client_errors.ZerocheckError and other.message == "HTTP 418: teapot" and other.code is None
