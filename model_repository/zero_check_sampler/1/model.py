"""Triton adapter for the zero-check sampler: one fused pass per batch, CUDA graphs on GPU."""
import torch
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.serving.sampler_inputs import answer, gather_batch
from zerocheck.serving.triton import ModelConfig


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        self.vocab_size = config.vocab_size()
        self.device = config.device()
        self.sampler = make_sampler(self.vocab_size, config.max_batch_size, self.device,
                                    config.get_int("cuda_graph_max_top_k", 64))

    def execute(self, requests):
        batch = gather_batch(pb_utils, requests, ["logits"], self.vocab_size)
        if batch.rows:
            logits = batch.tensors["logits"].to(self.device, non_blocking=True)
            out = self.sampler.sample(logits, batch.params, batch.history, batch.steps)
            answer(pb_utils, batch, {"output_id": out.tokens.to(torch.int32).cpu().numpy().reshape(-1, 1)}, out.errors)
        return batch.responses
