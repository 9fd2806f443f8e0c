"""A user's diffusers pipeline as the model of the commands that generate: ``--model`` names
a shipped model (``digits``, ``text``) or a diffusers pipeline, a local folder
(``save_pretrained``) or a Hub id; ``coda profile``, ``coda schedule search`` (on that
profile) and ``coda eval`` then run a :class:`coda.experiments.cfg_loop.CFGLoop` over its
transformer.

:func:`pipeline_loop` encodes the prompts once with the pipeline's own ``encode_prompt`` and
takes the latent shape from its ``prepare_latents`` and scheduler from the pipeline; a
profile records what rebuilds the loop (:func:`pipeline_meta`), so the commands that follow
it load the same model (:func:`load_profiled_model`). The videos compared are the final
latents (the VAE is not run).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["is_pipeline", "check_model_options", "load_pipeline", "pipeline_loop",
           "pipeline_meta", "load_model", "load_profiled_model", "PIPELINE_OPTIONS"]

#: the options that describe a pipeline's videos (ModelOptions), by field name
PIPELINE_OPTIONS = ("negative_prompt", "frames", "height", "width")


def is_pipeline(model: str) -> bool:
    """Whether ``--model`` names a diffusers pipeline rather than a shipped model."""
    from coda.host.model.dit import MODELS

    return model not in MODELS


def check_model_options(options) -> list[str] | None:
    """Check the model options of a command that generates (``options``: a config deriving
    from :class:`coda.host.model.choice.ModelOptions`). Returns the prompt texts for a
    pipeline ``--model``, None for a shipped model.

    Raises ValueError: a ``--model`` that is neither a pipeline folder nor a Hub id; a
    pipeline without ``--prompt``, or with ``--prompts`` / ``--weights``; a size below 1; an
    empty or repeated prompt."""
    from coda.options import given

    if not is_pipeline(options.model):
        return None              # coda.host.model.choice.chosen_prompts checks its options
    _check_spec(options.model)       # a missing folder is named before the other options
    texts = list(options.prompt or ())
    if given(options, "prompts", "0-9"):
        raise ValueError(f"--prompts {options.prompts}: prompt indices name the shipped "
                         f"models' prompts; a pipeline (--model {options.model}) takes "
                         "--prompt TEXT")
    if options.weights is not None:
        raise ValueError(f"--weights {options.weights}: the weights of a pipeline --model "
                         "are its own; expected no --weights")
    if not texts:
        raise ValueError(f"--model {options.model}: a diffusers pipeline, expected at least "
                         "one --prompt TEXT")
    for t in texts:
        if not t.strip():
            raise ValueError("--prompt '': expected a prompt text (the negative prompt is "
                             "--negative-prompt)")
    if len(set(texts)) != len(texts):
        dup = next(t for t in texts if texts.count(t) > 1)
        raise ValueError(f"--prompt {dup!r}: asked for twice")
    for name in ("frames", "height", "width"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} {value}: expected >= 1")
    return texts


def _check_spec(spec: str) -> None:
    """ValueError unless ``spec`` can name a pipeline: a folder with ``model_index.json``, or
    (nothing of that name here) a Hub id ``owner/name``."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ValueError(f"--model {spec}: a folder without model_index.json, expected a "
                             "diffusers pipeline folder (pipe.save_pretrained) or a shipped "
                             "model (digits, text)")
    elif path.exists() or spec.count("/") != 1 or spec.startswith(("/", ".", "~")):
        raise ValueError(f"--model {spec}: expected digits, text, a diffusers pipeline folder "
                         "or a Hub id (owner/name)")


def _folder(spec: str) -> Path:
    """The local folder of pipeline ``spec``: a folder with ``model_index.json``, or a Hub
    id downloaded (or found in the Hugging Face cache) by ``DiffusionPipeline.download``."""
    _check_spec(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    from diffusers import DiffusionPipeline

    try:
        return Path(DiffusionPipeline.download(spec))
    except Exception as exc:     # offline, unknown id, gated: one line, the library's reason
        raise ValueError(f"--model {spec}: no local folder of that name and the Hub id could "
                         f"not be fetched ({type(exc).__name__}: {exc})") from None


def load_pipeline(spec: str, device: str = "cpu"):
    """The diffusers pipeline ``spec`` names (:func:`_folder`), float32 on ``device``.

    Raises ValueError: not a pipeline folder or id; a pipeline without a ``transformer`` the
    cache engine serves, or with two (Wan 2.2's experts: ``coda.enable_cache`` serves them on
    the pipeline itself)."""
    from diffusers import DiffusionPipeline

    from coda.host.cache.arch import get_architecture

    folder = _folder(spec)
    index = json.loads((folder / "model_index.json").read_text())
    if index.get("transformer_2", [None])[0] is not None:
        raise ValueError(f"--model {spec}: a pipeline with two transformers (Wan 2.2's "
                         "experts); the commands profile one, expected a pipeline with one "
                         "(coda.enable_cache serves both experts on the pipeline)")
    # float32 (the cache's reference precision); ``dtype`` where diffusers has replaced
    # ``torch_dtype`` by it (deprecation_utils._resolve_dtype), else the old name
    from diffusers.utils import deprecation_utils
    key = "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"
    absent = {name: None for name, entry in index.items()     # saved without: e.g. a
              if not name.startswith("_") and entry == [None, None]}   # folder of embeddings
    pipe = DiffusionPipeline.from_pretrained(folder, **{key: torch.float32}, **absent)
    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        raise ValueError(f"--model {spec}: {type(pipe).__name__} has no transformer, expected "
                         "a video DiT pipeline (Latte, CogVideoX, Wan, HunyuanVideo)")
    get_architecture(transformer)        # UnsupportedModelError names the class
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    transformer.eval()
    return pipe


def _call_default(pipe, name: str):
    value = inspect.signature(type(pipe).__call__).parameters.get(name)
    return None if value is None else value.default


def pipeline_loop(pipe, texts: list[str], *, negative_prompt: str = "",
                  frames: int | None = None, height: int | None = None,
                  width: int | None = None):
    """A :class:`coda.experiments.cfg_loop.CFGLoop` over ``pipe``'s transformer for the prompt
    texts (each encoded with ``pipe.encode_prompt``, against ``negative_prompt``), the latent
    shape of ``prepare_latents`` for ``frames`` x ``height`` x ``width`` pixels (None: the
    pipeline's defaults), the pipeline's scheduler.

    Raises ValueError: a pipeline whose ``encode_prompt`` does not return (cond, uncond)
    embeddings (Wan, CogVideoX and Latte do; HunyuanVideo's adds pooled projections and
    masks), or one that cannot encode a prompt (no tokenizer or text encoder)."""
    from coda.experiments.cfg_loop import CFGLoop

    device = pipe.transformer.device
    prompts = []
    with torch.no_grad():
        for text in texts:
            try:
                out = pipe.encode_prompt(prompt=text, negative_prompt=negative_prompt,
                                         do_classifier_free_guidance=True,
                                         num_videos_per_prompt=1, device=device)
            except (TypeError, AttributeError) as exc:   # no tokenizer / text encoder
                raise ValueError(f"{type(pipe).__name__} could not encode --prompt {text!r} "
                                 f"({type(exc).__name__}: {exc}): expected a pipeline with "
                                 "its tokenizer and text encoder") from None
            if not (isinstance(out, tuple) and len(out) == 2
                    and all(isinstance(t, torch.Tensor) for t in out)):
                raise ValueError(f"{type(pipe).__name__}.encode_prompt gives no (cond, uncond) "
                                 "embeddings: expected a Wan, CogVideoX or Latte pipeline")
            prompts.append(tuple({"encoder_hidden_states": t.float()} for t in out))
    size = {"num_frames": frames or _call_default(pipe, "num_frames"),
            "height": height or _call_default(pipe, "height"),
            "width": width or _call_default(pipe, "width")}
    missing = [k for k, v in size.items() if not isinstance(v, int)]
    if missing:
        raise ValueError(f"{type(pipe).__name__} has no default {missing[0]}: expected "
                         f"--{'frames' if missing[0] == 'num_frames' else missing[0]}")
    latents = pipe.prepare_latents(batch_size=1,
                                   num_channels_latents=pipe.transformer.config.in_channels,
                                   dtype=torch.float32, device=device,
                                   generator=torch.Generator(device).manual_seed(0), **size)
    return CFGLoop(pipe.transformer, prompts, tuple(latents.shape[1:]),
                   scheduler=pipe.scheduler)


def pipeline_meta(options, texts: list[str]) -> dict:
    """What a profile records of a pipeline model (:func:`load_profiled_model` rebuilds the
    loop from it): ``model`` (the folder, absolute, or the Hub id), ``pipeline_prompts``
    (the texts; the profile's prompts are their indices), and the video options."""
    path = Path(options.model).expanduser()
    return {"model": str(path.resolve()) if path.is_dir() else options.model,
            "weights": None, "pipeline_prompts": list(texts),
            **{k: getattr(options, k) for k in PIPELINE_OPTIONS}}


def load_model(options, device: str = "cpu") -> tuple[Any, list, dict]:
    """(the model, the prompts to generate, what a profile records of the model) of a
    command's model options: a shipped model with its prompts (indices and texts:
    :func:`coda.host.model.choice.chosen_prompts`), or a pipeline's :class:`CFGLoop` with
    the indices of its ``--prompt`` texts. Raises ValueError as
    :func:`check_model_options`, :func:`load_pipeline`, :func:`pipeline_loop`."""
    from coda.host.model.choice import chosen_prompts, load_chosen, model_meta

    texts = check_model_options(options)
    if texts is None:
        prompts = chosen_prompts(options)
        return load_chosen(options, device), prompts, model_meta(options)
    pipe = load_pipeline(options.model, device)
    loop = pipeline_loop(pipe, texts, **{k: getattr(options, k) for k in PIPELINE_OPTIONS})
    return loop, list(range(len(texts))), pipeline_meta(options, texts)


def load_profiled_model(meta: dict, what: str, device: str = "cpu"):
    """The model a profile was made with: a shipped one
    (:func:`coda.host.model.choice.load_profiled`) or the pipeline loop its metadata
    describes (:func:`pipeline_meta`), checked against its ``model_hash``. Raises ValueError
    naming ``what`` when the model changed since."""
    from coda.host.cache.profile import model_hash
    from coda.host.model.choice import load_profiled

    if not is_pipeline(meta.get("model", "digits")):
        return load_profiled(meta, what, device)
    pipe = load_pipeline(meta["model"], device)
    loop = pipeline_loop(pipe, meta["pipeline_prompts"],
                         **{k: meta.get(k) for k in PIPELINE_OPTIONS})
    if "model_hash" in meta and meta["model_hash"] != model_hash(loop):
        raise ValueError(f"{what}: made for model {meta['model_hash']!r}, but the pipeline "
                         f"{meta['model']} hashes to {model_hash(loop)!r}; profile again")
    return loop
