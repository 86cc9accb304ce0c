"""`tensorrt_llm` of the trtllm flavor: tensorrtllm_backend's token-level interface (ids in, ids out, streaming)
served by TensorRT-LLM's LLM API with zerocheck's sampler as each sequence's logits processor
(zerocheck.trtllm.llm_api). The load stops, naming what it found, when tensorrt_llm is missing or of an unsupported
version. Each request runs as a task on the stub's event loop, where every pb_utils object is used."""
import asyncio

import triton_python_backend_utils as pb_utils

from zerocheck.api.request import TOKEN_INPUTS
from zerocheck.triton.config import ModelConfig, parameters
from zerocheck.triton.forward import is_stop_request
from zerocheck.triton.tensors import error_for, request_arrays, request_parameters, tensors
from zerocheck.trtllm.llm_api import Answers, LlmApiParameters, start_token_model

INPUT_NAMES = [spec.name for spec in TOKEN_INPUTS]
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def answers_for(sender) -> Answers:
    def send(arrays, final):
        flags = FINAL if final else 0
        if arrays is None:
            sender.send(flags=flags)
        else:
            sender.send(pb_utils.InferenceResponse(tensors(pb_utils, arrays)), flags=flags)

    def fail(error):
        sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error_for(pb_utils, error)), flags=FINAL)

    return Answers(send, fail)


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        self.model = start_token_model(config.artifacts_dir(), parameters(LlmApiParameters, config))

    async def execute(self, requests):
        """Serves `requests` to their final responses (the stub runs this in the background)."""
        served = []
        for request in requests:
            answers = answers_for(request.get_response_sender())
            try:
                arrays = request_arrays(pb_utils, request, INPUT_NAMES)
                if is_stop_request(arrays):
                    self.model.stop(request.request_id())
                    answers.send({}, final=True)  # one empty final response, as `generate` answers a stop
                    answers.close()
                    continue
                rows = self.model.prepare(arrays, request_parameters(request))
            except Exception as error:  # never a traceback to the client
                answers.close(error)
                continue
            served.append(self.model.serve(request.request_id(), rows, answers, request.is_cancelled))
        await asyncio.gather(*served)

    def finalize(self):
        if hasattr(self, "model"):  # a refused load has none
            self.model.shutdown()
