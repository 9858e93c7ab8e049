"""Rows of different LoRA roles in one forward: each row's own adapter, or none, on one shared base model.

A role may carry a LoRA adapter (a D-SFT/D-DPO Moderator) on the base its Debaters use as they are. peft applies its
active adapters to every row of a forward alike; a decode batch holds rows of every role at once. So while the batch
runs the model, every adapter is active and each adapter's scaling, the number peft multiplies its low-rank output by
(alpha / r), is a tensor of one value a row: the adapter's scaling in the rows that use it, 0 in the others (`over`).
A row of the base gets the base's output plus exact zeros; a row of an adapter gets what peft gives with that adapter
alone, up to the scaling's rounding in the adapter's dtype (exact for the usual alpha / r: 1, 2, 0.5 ...). The
adapters' matmuls run on every row: rank 8-64 against the base's thousands of columns, about 1% more work an adapter.

Outside the batch's forwards the model is as the roles left it (debate.engine.models.adapter_scope): the scalings are
numbers again, the active adapter the scope's.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch


def lora_layers(model: torch.nn.Module) -> List[Any]:
    """The model's LoRA layers (peft's LoraLayer), none for a plain model."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is a dependency; without it no model carries adapters
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def current(model: torch.nn.Module) -> Optional[str]:
    """The adapter the model's forwards use now (what adapter_scope set), or None for the base alone."""
    layers = lora_layers(model)
    if not layers or layers[0].disable_adapters:
        return None
    active = layers[0].active_adapters
    return active[0] if active else None


class RowAdapters:
    """Which adapter each slot of a decode place uses, as the per-row scalings of the model's LoRA layers."""

    def __init__(self, model: torch.nn.Module, rows: int) -> None:
        self.layers = lora_layers(model)
        self.names = sorted({name for layer in self.layers for name in layer.lora_A.keys()})
        # One tensor (rows, 1, 1) per adapter and distinct scaling, in its weights' dtype and device, shared by the
        # layers with that scaling; the layers' (layer, adapter) -> tensor.
        self.tensors: Dict[Tuple[str, float, torch.dtype, torch.device], torch.Tensor] = {}
        self.of_layer: List[Dict[str, torch.Tensor]] = []
        for layer in self.layers:
            own = {}
            for name in layer.lora_A.keys():
                weight = layer.lora_B[name].weight
                key = (name, float(layer.scaling[name]), weight.dtype, weight.device)
                if key not in self.tensors:
                    self.tensors[key] = torch.zeros((rows, 1, 1), dtype=weight.dtype, device=weight.device)
                own[name] = self.tensors[key]
            self.of_layer.append(own)
        self._views: Dict[Tuple[int, int], List[Dict[str, torch.Tensor]]] = {}
        self._buffers: Dict[Tuple[int, ...], Dict[Tuple[str, float, torch.dtype, torch.device], torch.Tensor]] = {}

    def __bool__(self) -> bool:
        return bool(self.names)

    def assign(self, slot: int, adapter: Optional[str]) -> None:
        """Slot `slot`'s row uses `adapter` (None: the base alone)."""
        for (name, scale, _, _), tensor in self.tensors.items():
            tensor[slot] = scale if name == adapter else 0.0

    def move(self, source: int, target: int) -> None:
        for tensor in self.tensors.values():
            tensor[target] = tensor[source]

    @contextlib.contextmanager
    def over(self, start: int, stop: int) -> Iterator[None]:
        """Forwards over slots [start, stop) use each row's own adapter; the layers as they were afterwards."""
        if not self.names:
            yield
            return
        key = (start, stop)
        if key not in self._views:  # the same view objects every time: a compiled step sees the same inputs
            self._views[key] = [{n: t[start:stop] for n, t in own.items()} for own in self.of_layer]
        with self._scaled(self._views[key]):
            yield

    @contextlib.contextmanager
    def tokens(self, slots: torch.Tensor, bucket: Optional[Tuple[int, ...]] = None) -> Iterator[None]:
        """A step's forward, one sequence whose token i is of slot slots[i]: each token gets its slot's adapter (a
        scaling of shape (1, tokens, 1)). With `bucket` (a compiled step's), into tensors kept for that bucket: the
        same tensors at every step of it, which a compiled graph reads as its inputs and a CUDA graph replays."""
        if not self.names:
            yield
            return
        if bucket is None:
            picked = {key: t.index_select(0, slots.to(t.device)).reshape(1, -1, 1) for key, t in self.tensors.items()}
        else:
            picked = self._buffers.get(bucket, {})
            if not picked:
                picked = {key: t.new_empty((1, slots.shape[0], 1)) for key, t in self.tensors.items()}
                self._buffers[bucket] = picked
            for key, t in self.tensors.items():
                torch.index_select(t, 0, slots.to(t.device), out=picked[key].view(-1, 1, 1))
        by_tensor = {id(t): picked[key] for key, t in self.tensors.items()}
        with self._scaled([{n: by_tensor[id(t)] for n, t in own.items()} for own in self.of_layer]):
            yield

    @contextlib.contextmanager
    def _scaled(self, scalings: List[Dict[str, torch.Tensor]]) -> Iterator[None]:
        saved = [(layer._active_adapter, layer._disable_adapters, dict(layer.scaling)) for layer in self.layers]
        for layer, views in zip(self.layers, scalings):
            layer._active_adapter = list(views)
            layer._disable_adapters = False
            layer.scaling.update(views)
        try:
            yield
        finally:
            for layer, (active, disabled, scaling) in zip(self.layers, saved):
                layer._active_adapter, layer._disable_adapters = active, disabled
                layer.scaling.clear()
                layer.scaling.update(scaling)
