"""Shared test setup: one torch thread (the CI machine has 2 cores shared with others)."""

import torch

torch.set_num_threads(1)
