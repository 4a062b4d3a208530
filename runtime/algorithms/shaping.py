"""Reward shaping: DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4, eq. 13).

A response longer than L_max - L_cache tokens loses a share of the penalty factor that grows linearly
with its excess, reaching the whole factor at the generation budget L_max; shorter responses are not
touched. It tells the model that running out of budget is bad without the noise of punishing a
truncated but correct answer as hard as a wrong one. As verl's DAPO reward manager
(`overlong_buffer`: len, penalty_factor): min(-(length - (L_max - L_cache)) / L_cache * factor, 0).
"""

from torch import Tensor


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer_length: int, penalty_factor: float) -> Tensor:
    """(N,) penalty <= 0 for responses of `lengths` tokens.

    Budget 20 tokens, buffer 4: a response of 16 tokens or fewer gets 0, 18 gets -0.5, 20 gets -1.

    >>> import torch
    >>> overlong_penalty(torch.tensor([10, 16, 18, 20]), max_new_tokens=20, buffer_length=4, penalty_factor=1.0)
    tensor([ 0.0000,  0.0000, -0.5000, -1.0000])
    """
    expected = max_new_tokens - buffer_length
    excess = lengths.float() - expected  # (N,)
    return (-excess / buffer_length * penalty_factor).clamp(max=0.0) + 0.0  # (N,) + 0.0 makes -0.0 plain 0
