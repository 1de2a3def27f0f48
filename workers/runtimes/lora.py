"""LoRA adapters over a loaded torch model, with PEFT: many at once, mixed in one forward pass.

A base runtime (torch_model.TorchModel) gets its `LoraLayers` with its first
adapter: PEFT wraps the runtime's transformers model (the one inside a
sentence-transformers model, or the model itself), putting LoRA layers in
place of the Linear modules the adapter targets. The model object is kept,
so the runtime's own forward (sentence-transformers' modules, a
classification head) runs through them unchanged.

An adapter's config and weights are read off the device thread
(`read_adapter`); it is added, and later removed, on the device thread
between two forward batches, so no forward sees the layers change. The last
adapter out unloads PEFT's layers, leaving the base as it was loaded.

Every forward batch of a base with LoRA layers names each input's adapter
(`rows`): PEFT's mixed-batch inference (``adapter_names``: each LoRA layer
computes the base once and adds each adapter's update to its own rows),
``__base__`` for inputs of the base alone. A batch of the base alone runs
with the adapters disabled. PEFT's forward does this inside
``PeftModel.forward``; the runtimes' forwards are not PEFT's, so `rows` enters
the same context PEFT's forward enters (`PeftModel._enable_peft_forward_hooks`,
peft 0.10 to 0.21: pinned in pyproject.toml, held by tests/kinds/test_adapters.py).
"""

from __future__ import annotations

import asyncio
import inspect
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from ...configs import AdapterSpec, ModelSpec
from ...configs.adapters import BASE_ROWS, PEFT_MODULE_BYTES, PEFT_PREFIX, lora_modules
from ..batching.device_thread import DeviceThread
from .torch_model import TorchModel

# The PEFT modules that hold one entry per adapter (`...lora_A.NAME.weight`): an adapter's own parameters.
ADAPTER_OWNERS = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "modules_to_save"}


class AdapterMismatch(ValueError):
    """The adapter's weights do not fit the loaded base (names or shapes PEFT could not place)."""


@dataclass
class AdapterWeights:
    """An adapter as read from its folder: PEFT's config and its weights, on the base's device."""

    spec: AdapterSpec
    config: Any  # peft.LoraConfig
    state: dict[str, Any]  # tensor name -> tensor


def read_adapter(spec: AdapterSpec, device: str) -> AdapterWeights:
    """Read an adapter's config and weights (any thread: nothing of the model is touched)."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    config = PeftConfig.from_pretrained(spec.source)
    config.inference_mode = True
    state = load_peft_weights(spec.source, device=device)
    # Weights saved by transformers' own adapter support lack PEFT's prefix for the wrapped model.
    state = {key if key.startswith(PEFT_PREFIX) else PEFT_PREFIX + key: value for key, value in state.items()}
    return AdapterWeights(spec, config, state)


class LoraLayers:
    """The adapters loaded over one base runtime's model, by name.

    PEFT adds an adapter by walking the whole model several times, and the model grows with each adapter
    loaded: the hundredth costs ten times the first. An adapter that only puts LoRA matrices on layers PEFT
    has wrapped already (a fleet trained with one recipe) is added the way PEFT's own walk adds it to an
    existing LoRA layer, ``update_layer`` on each, with its weights copied in: its cost no longer grows with
    the adapters loaded. Anything else (the first adapter, new target layers, saved modules, rank or alpha
    patterns) goes through PEFT's ``add_adapter``; removal likewise.
    """

    def __init__(self, model: Any) -> None:
        """`model`: the runtime's transformers model (its layers are replaced in place)."""
        self.model = model
        self.peft: Any = None  # peft.PeftModel around `model` while any adapter is loaded
        self.bytes: dict[str, int] = {}  # adapter name -> bytes of its weights, as loaded
        self._layers: dict[str, Any] = {}  # module path in `peft` -> its LoRA layer (peft's LoraLayer)
        self._placed: dict[str, list[Any]] = {}  # adapter -> the layers it was placed on directly

    @classmethod
    def of(cls, runtime_model: Any) -> LoraLayers:
        """The LoRA layers of a runtime's model: a sentence-transformers model's transformers model, or it."""
        inner = getattr(runtime_model, "transformers_model", None)
        return cls(inner if inner is not None else runtime_model)

    def add(self, weights: AdapterWeights) -> int:
        """Add an adapter (device thread): its measured bytes. AdapterMismatch if PEFT cannot place all of it."""
        name = weights.spec.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's notes on adapters added for inference only
            try:
                if not self._place(name, weights):
                    self._add_through_peft(name, weights)
            except Exception:
                self.remove(name)
                raise
        # As loaded: its tensors in the base's dtype (counted from the file's tensors, not by walking the model),
        # and PEFT's objects around them.
        element = next(self.model.parameters()).element_size()
        tensors = sum(tensor.numel() * element for tensor in weights.state.values())
        self.bytes[name] = tensors + PEFT_MODULE_BYTES * lora_modules(weights.state)
        return self.bytes[name]

    def _add_through_peft(self, name: str, weights: AdapterWeights) -> None:
        from peft import MODEL_TYPE_TO_PEFT_MODEL_MAPPING, PeftModel
        from peft.tuners.lora import LoraLayer
        from peft.utils import set_peft_model_state_dict

        if self.peft is None:
            wrapper = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(weights.config.task_type, PeftModel)
            self.peft = wrapper(self.model, weights.config, adapter_name=name, autocast_adapter_dtype=False)
        else:
            self.peft.add_adapter(name, weights.config, autocast_adapter_dtype=False)
        self.peft.eval()
        self._layers = {path: m for path, m in self.peft.named_modules() if isinstance(m, LoraLayer)}
        result: Any = set_peft_model_state_dict(self.peft, weights.state, adapter_name=name)
        missing = sorted(key for key in result.missing_keys if _owned_by(key, name))
        if result.unexpected_keys or missing:
            raise AdapterMismatch(
                f"adapter {name!r} ({weights.spec.source}) does not fit base model {weights.spec.base!r}: "
                f"weights the base has no place for: {sorted(result.unexpected_keys)[:5]}; "
                f"LoRA weights missing: {missing[:5]}"
            )

    def _place(self, name: str, weights: AdapterWeights) -> bool:
        """Put an adapter's matrices on LoRA layers already there, as PEFT's walk would; False when it needs the
        walk (see the class docstring)."""
        import torch

        config = weights.config
        if self.peft is None or config.modules_to_save or config.rank_pattern or config.alpha_pattern:
            return False
        matrices: dict[str, dict[str, Any]] = {}  # layer path -> {"A": tensor, "B": tensor}
        for key, tensor in weights.state.items():
            path, _, part = key.partition(".lora_")
            if part not in ("A.weight", "B.weight") or path not in self._layers:
                return False
            matrices.setdefault(path, {})[part[0]] = tensor
        if any(len(pair) != 2 for pair in matrices.values()):
            return False
        placed = self._placed[name] = []  # so that a failure part way is undone by `remove`
        for path, pair in matrices.items():
            layer = self._layers[path]
            layer.update_layer(name, config.r, lora_alpha=config.lora_alpha, target_name=path, config=config)
            placed.append(layer)
            with torch.no_grad():
                for part, tensor in pair.items():
                    target = getattr(layer, f"lora_{part}")[name].weight
                    if target.shape != tensor.shape:
                        raise AdapterMismatch(
                            f"adapter {name!r} ({weights.spec.source}) does not fit base model "
                            f"{weights.spec.base!r}: {path}.lora_{part} is {list(tensor.shape)}, the layer takes "
                            f"{list(target.shape)}"
                        )
                    target.copy_(tensor)
        self.peft.peft_config[name] = config
        return True

    def remove(self, name: str) -> None:
        """Remove an adapter (device thread); the last one out unloads PEFT's layers."""
        self.bytes.pop(name, None)
        placed = self._placed.pop(name, None)
        if self.peft is None or name not in self.peft.peft_config:
            for layer in placed or []:  # placed on some layers before it failed
                layer.delete_adapter(name)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "adapter X was active which is now deleted"
            if len(self.peft.peft_config) == 1:
                self.model = self.peft.unload()
                self.peft, self._layers, self._placed = None, {}, {}
            elif placed is not None and name not in self.peft.active_adapters:
                for layer in placed:  # as PEFT's delete_adapter does on each layer, without its walk
                    layer.delete_adapter(name)
                del self.peft.peft_config[name]
            else:
                self.peft.delete_adapter(name)

    def names(self) -> list[str]:
        return list(self.peft.peft_config) if self.peft is not None else []

    def rows(self, names: Sequence[str | None]) -> AbstractContextManager[Any]:
        """Around one forward batch: each input through its adapter (None: the base alone)."""
        if self.peft is None:
            return nullcontext()
        # The base's own rows too: PEFT's layers would otherwise add the active adapter to them. (Disabling
        # the adapters instead walks every layer twice per batch: slower once many adapters are loaded.)
        return self.peft._enable_peft_forward_hooks(adapter_names=[name or BASE_ROWS for name in names])


def _owned_by(key: str, name: str) -> bool:
    """Whether a parameter's name is one of adapter `name`'s: its LoRA matrices, its copies of saved modules."""
    parts = key.split(".")
    return any(owner in ADAPTER_OWNERS and part == name for owner, part in zip(parts, parts[1:]))


class AdapterRuntime:
    """One adapter over its loaded base, as its model's operations use it: the base's runtime, each call that
    takes per-input `adapters` running every input through this adapter when it names none (None)."""

    def __init__(self, base: Any, spec: ModelSpec) -> None:
        assert spec.adapter is not None
        self.base = base
        self.spec = spec  # the adapter's: its name is BASE+ADAPTER, its window and batching the base's
        self.adapter = spec.adapter.name

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self.base, attribute)
        if callable(value) and "adapters" in _parameters(value):
            return partial(_through_adapter, value, self.adapter)
        return value


def _through_adapter(call: Any, adapter: str, *args: Any, adapters: Any = None, **kwargs: Any) -> Any:
    """`call` with its inputs through `adapter`, unless the caller names the inputs' adapters itself."""
    return call(*args, adapters=adapter if adapters is None else adapters, **kwargs)


@lru_cache(maxsize=256)
def _parameter_names(function: Any) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def _parameters(method: Any) -> frozenset[str]:
    """The parameter names of a bound method, read once per function."""
    return _parameter_names(getattr(method, "__func__", method))


def _timed(function: Any, *args: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    return function(*args), time.perf_counter() - began


def load_adapter_alone(spec: ModelSpec, base: Any) -> Any:
    """`spec`'s adapter over a `base` runtime loaded for it alone: tuning and the quality gate, and a merged
    adapter (`AdapterSpec.merged`), whose base copy then holds the adapter in its weights, as a model of its own."""
    assert spec.adapter is not None and isinstance(base, TorchModel)
    layers = LoraLayers.of(base.model)
    layers.add(read_adapter(spec.adapter, "cpu"))
    if spec.adapter.merged:
        layers.peft.merge_and_unload()  # in place: the runtime's model computes base and adapter in one weight
        base.spec = spec
        return base
    base.lora = layers
    return AdapterRuntime(base, spec)


class AdapterLoader:
    """The model pool's hands for adapters: read in an I/O thread, placed on and removed from a base's model on
    the device thread, between two forward batches (and in order: a removal queued before a load runs first)."""

    def __init__(self, device_thread: DeviceThread, executor: Executor) -> None:
        self.device_thread = device_thread
        self.executor = executor

    async def attach(self, base: Any, spec: ModelSpec) -> tuple[AdapterRuntime, int, float]:
        """`spec`'s adapter over the loaded `base` runtime: its runtime, its measured bytes, and the seconds its
        own work took (reading and placing it, not its waits behind other loads: what placement expects)."""
        assert spec.adapter is not None
        if not isinstance(base, TorchModel):
            raise AdapterMismatch(
                f"model {spec.name!r}: its base {spec.adapter.base!r} is loaded on a runtime without LoRA layers "
                f"({type(base).__name__}); adapters run on torch"
            )
        loop = asyncio.get_running_loop()
        weights, reading = await loop.run_in_executor(self.executor, _timed, read_adapter, spec.adapter, "cpu")
        if base.lora is None:
            base.lora = LoraLayers.of(base.model)
        layers = base.lora
        assert isinstance(layers, LoraLayers)
        size, placing = await asyncio.wrap_future(self.device_thread.run_online(partial(_timed, layers.add, weights)))
        return AdapterRuntime(base, spec), size, reading + placing

    def takes(self, base: Any) -> bool:
        return isinstance(base, TorchModel)

    def detach(self, base: Any, name: str) -> None:
        """Remove adapter `name` from `base`'s model at the device thread's next turn."""
        layers = getattr(base, "lora", None)
        if isinstance(layers, LoraLayers):
            self.device_thread.run_online(partial(layers.remove, name))
