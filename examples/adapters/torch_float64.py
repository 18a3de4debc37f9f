"""Conformance adapter: the PyTorch restatement of torch_restatement.py in float64.

    ntpref conformance examples/adapters/torch_float64.py
"""
import torch

from .torch_restatement import TorchModels

_models = TorchModels(torch.float64)
evaluate, train = _models.evaluate, _models.train
