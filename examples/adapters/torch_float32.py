"""Conformance adapter: the PyTorch restatement of torch_restatement.py in float32 (the setting of the
shallow paper's public code). Judge it against float32 arithmetic:

    ntpref conformance examples/adapters/torch_float32.py --precision float32
"""
import torch

from .torch_restatement import TorchModels

_models = TorchModels(torch.float32)
evaluate, train = _models.evaluate, _models.train
