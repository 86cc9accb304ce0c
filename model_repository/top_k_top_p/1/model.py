"""Checked chain, stage 3: full sort, top-k, cumulative top-p, min-p, renormalise."""
import torch
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.batch import build_batch
from zerocheck.sampling.checked import sort_and_filter
from zerocheck.triton.sampler_batch import gather_batch, refuse_nan, respond
from zerocheck.triton.config import ModelConfig


class TritonPythonModel:
    def initialize(self, args):
        self.vocab_size = ModelConfig(args).vocab_size()

    def execute(self, requests):
        batch = gather_batch(pb_utils, requests, ["probs"], self.vocab_size, refuse_nan("probs", probabilities=True))
        return respond(pb_utils, batch, self.filter)

    def filter(self, batch):
        probs = batch.tensors["probs"].float()
        sorted_probs, order = sort_and_filter(probs, build_batch(batch.params, self.vocab_size, None, batch.steps))
        return {"sorted_probs": sorted_probs.numpy(), "sorted_ids": order.to(torch.int32).numpy()}, [None] * len(batch.rows)
