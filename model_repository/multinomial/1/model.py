"""Checked chain, stage 4: multinomial draw over the sorted, filtered probabilities."""
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.checked import draw_sorted
from zerocheck.serving.sampler_inputs import answer, gather_batch
from zerocheck.serving.triton import ModelConfig


class TritonPythonModel:
    def initialize(self, args):
        self.vocab_size = ModelConfig(args).vocab_size()

    def execute(self, requests):
        batch = gather_batch(pb_utils, requests, ["sorted_probs"], self.vocab_size)
        if batch.rows:
            order = torch.from_numpy(np.concatenate(
                [pb_utils.get_input_tensor_by_name(requests[i], "sorted_ids").as_numpy() for i in batch.indices]))
            tokens, log_probs = draw_sorted(batch.tensors["sorted_probs"].float(), order.long(), batch.params,
                                            batch.steps)
            answer(pb_utils, batch, {"output_id": tokens.to(torch.int32).numpy().reshape(-1, 1),
                                     "output_log_prob": log_probs.numpy().reshape(-1, 1)}, [None] * len(batch.rows))
        return batch.responses
