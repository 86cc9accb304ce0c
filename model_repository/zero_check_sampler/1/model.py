"""Triton adapter for the zero-check sampler: one fused pass per batch, CUDA graphs on GPU."""
import torch
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.triton.sampler_batch import gather_batch, respond
from zerocheck.triton.config import ModelConfig, SamplerParameters, parameters


class TritonPythonModel:
    def initialize(self, args):
        config = ModelConfig(args)
        params = parameters(SamplerParameters, config)
        self.vocab_size = config.vocab_size()
        self.device = config.instance_device(params.resolved_device())
        self.sampler = make_sampler(self.vocab_size, config.max_batch_size, self.device, params.cuda_graph_max_top_k)

    def execute(self, requests):
        return respond(pb_utils, gather_batch(pb_utils, requests, ["logits"], self.vocab_size), self.sample)

    def sample(self, batch):
        logits = batch.tensors["logits"].to(self.device, non_blocking=True)
        out = self.sampler.sample(logits, batch.params, batch.history, batch.steps)
        return {"output_id": out.tokens.to(torch.int32).cpu().numpy().reshape(-1, 1)}, out.errors
