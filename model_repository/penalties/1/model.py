"""Checked chain, stage 1: logit bias, penalties and bad words over the whole [B, V] logits."""
import torch
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.batch import build_batch
from zerocheck.sampling.checked import penalize
from zerocheck.triton.sampler_batch import gather_batch, respond
from zerocheck.triton.config import ModelConfig


class TritonPythonModel:
    def initialize(self, args):
        self.vocab_size = ModelConfig(args).vocab_size()

    def execute(self, requests):
        return respond(pb_utils, gather_batch(pb_utils, requests, ["logits"], self.vocab_size), self.penalize)

    def penalize(self, batch):
        x = batch.tensors["logits"].float().clone()
        nan = torch.isnan(x).any(-1).tolist()
        x[torch.tensor(nan)] = 0.0
        penalize(x, build_batch(batch.params, self.vocab_size, batch.history, batch.steps), batch.params, batch.history)
        return {"penalized_logits": x.numpy()}, ["logits contain NaN" if n else None for n in nan]
