"""Triton adapter for incremental detokenization (offsets in, offsets out: no per-sequence state)."""
import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.api.errors import InvalidRequest
from zerocheck.wire.sampling import check_token_ids
from zerocheck.triton.config import ModelConfig
from zerocheck.triton.tensors import error_response, request_arrays, tensors
from zerocheck.tokenizer import IncrementalDetokenizer, load_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = load_tokenizer(ModelConfig(args).artifacts_dir())

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                arrays = request_arrays(pb_utils, request, ("output_ids", "prefix_offset", "read_offset"))
                check_token_ids("output_ids", arrays["output_ids"], self.tokenizer.vocab_size)
                ids = arrays["output_ids"].reshape(-1).tolist()
                prefix = int(arrays.get("prefix_offset", np.zeros(1)).reshape(-1)[0])
                read = int(arrays.get("read_offset", np.zeros(1)).reshape(-1)[0])
                try:
                    detok = IncrementalDetokenizer.resume(self.tokenizer, ids, prefix, read)
                except ValueError as error:  # offsets out of order or past the ids
                    raise InvalidRequest(str(error)) from None
                text = detok.push([])
                prefix, read = detok.offsets
                responses.append(pb_utils.InferenceResponse(tensors(pb_utils, {
                    "text_output": np.array([[text.encode()]], dtype=object),
                    "prefix_offset": np.array([[prefix]], dtype=np.int32),
                    "read_offset": np.array([[read]], dtype=np.int32)})))
            except Exception as error:
                responses.append(error_response(pb_utils, error))
        return responses
