"""Checked chain, stage 4: multinomial draw over the sorted, filtered probabilities."""
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from zerocheck.sampling.checked import draw_sorted, top_alternatives
from zerocheck.api.errors import InvalidRequest
from zerocheck.api.request import TOP_LOG_PROBS
from zerocheck.wire.sampling import check_token_ids
from zerocheck.triton.sampler_batch import gather_batch, refuse_nan, respond
from zerocheck.triton.config import ModelConfig


def sorted_ids_of(present) -> np.ndarray:
    tensor = present.get("sorted_ids")
    return tensor.as_numpy() if tensor is not None else np.zeros((0, 0), np.int32)


class TritonPythonModel:
    def initialize(self, args):
        self.vocab_size = ModelConfig(args).vocab_size()
        self.probs_ok = refuse_nan("sorted_probs", probabilities=True)

    def check(self, present, values):
        """Also keeps each request's sorted ids, in request order, for `draw`."""
        self.probs_ok(present, values)
        ids = sorted_ids_of(present)
        if ids.shape != tuple(values["sorted_probs"].shape):
            raise InvalidRequest(f"sorted_ids must have the shape of sorted_probs {list(values['sorted_probs'].shape)}, "
                                 f"got {list(ids.shape)}")
        check_token_ids("sorted_ids", ids, self.vocab_size)
        self.sorted_ids.append(ids)

    def execute(self, requests):
        self.sorted_ids = []
        return respond(pb_utils, gather_batch(pb_utils, requests, ["sorted_probs"], self.vocab_size, self.check),
                       self.draw)

    def draw(self, batch):
        order = torch.from_numpy(np.concatenate(self.sorted_ids))
        sorted_probs = batch.tensors["sorted_probs"].float()
        tokens, log_probs = draw_sorted(sorted_probs, order.long(), batch.params, batch.steps)
        top_ids, top_log_probs = top_alternatives(sorted_probs, order, TOP_LOG_PROBS)
        return {"output_id": tokens.to(torch.int32).numpy().reshape(-1, 1),
                "output_log_prob": log_probs.numpy().reshape(-1, 1),
                "top_ids": top_ids.numpy(), "top_log_probs": top_log_probs.numpy()}, [None] * len(batch.rows)
