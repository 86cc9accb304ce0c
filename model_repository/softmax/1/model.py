"""Checked chain, stage 2: temperature and softmax over the whole vocabulary."""
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.batch import build_batch
from zerocheck.sampling.checked import tempered_probs
from zerocheck.triton.sampler_batch import gather_batch, refuse_nan, respond
from zerocheck.triton.config import ModelConfig


class TritonPythonModel:
    def initialize(self, args):
        self.vocab_size = ModelConfig(args).vocab_size()

    def execute(self, requests):
        batch = gather_batch(pb_utils, requests, ["penalized_logits"], self.vocab_size, refuse_nan("penalized_logits"))
        return respond(pb_utils, batch, self.softmax)

    def softmax(self, batch):
        x = batch.tensors["penalized_logits"].float()
        probs = tempered_probs(x, build_batch(batch.params, self.vocab_size, None, batch.steps))
        return {"probs": probs.numpy()}, [None] * len(batch.rows)
