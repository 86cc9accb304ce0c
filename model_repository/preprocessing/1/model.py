"""Triton adapter for the tokenizer: text -> token ids, word lists -> [2, N] id lists."""
import numpy as np
import triton_python_backend_utils as pb_utils

from zerocheck.api.request import Limits, parse_generate_request
from zerocheck.wire.sampling import encode_word_list
from zerocheck.triton.config import ModelConfig
from zerocheck.triton.tensors import error_response, request_arrays, tensors
from zerocheck.tokenizer import load_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = load_tokenizer(ModelConfig(args).artifacts_dir())
        self.limits = Limits()

    def execute(self, requests):
        responses = []
        for request in requests:
            try:  # the generate request parser validates text and word lists the same way here
                parsed = parse_generate_request(request_arrays(pb_utils, request, ("text_input", "bad_words", "stop_words")),
                                                {}, self.limits)
                ids = self.tokenizer.encode(parsed.prompt)
                words = {name: encode_word_list([w for w in self.tokenizer.token_ids_of(list(words)) if w])[0]
                         for name, words in (("bad_words_ids", parsed.bad_words), ("stop_words_ids", parsed.stop_words))}
                responses.append(pb_utils.InferenceResponse(tensors(pb_utils, {
                    "input_ids": np.array([ids], dtype=np.int32).reshape(1, -1),
                    "input_length": np.array([[len(ids)]], dtype=np.int32),
                    "bad_words_ids": words["bad_words_ids"][None], "stop_words_ids": words["stop_words_ids"][None]})))
            except Exception as error:
                responses.append(error_response(pb_utils, error))
        return responses
