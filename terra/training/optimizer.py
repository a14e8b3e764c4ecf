"""The optimizer a run steps (``train.optimizer``): AdamW over the trained weights, weight decay on matrices only."""

from __future__ import annotations

import torch

from terra.training.settings import TrainSpec


def make_optimizer(module: torch.nn.Module, spec: TrainSpec, device: torch.device) -> torch.optim.Optimizer:
    """``train.optimizer`` over ``module``'s trained weights, weight decay on matrices only."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": spec.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, fused=device.type == "cuda")
    from torchao.optim import AdamW8bit

    cls = AdamW8bit if device.type == "cuda" else eager(AdamW8bit)
    # stochastic rounding acts on bf16 weights only; float32 ones are updated exactly
    return cls(groups, lr=spec.lr, betas=spec.betas, bf16_stochastic_round=True)


def eager(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``cls`` with the ``torch.compile`` calls inside its step run as plain Python (torch's "force_eager" stance)."""
    return type(f"Eager{cls.__name__}", (cls,), {"step": torch.compiler.set_stance("force_eager")(cls.step)})
