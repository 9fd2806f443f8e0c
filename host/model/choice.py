"""Which shipped model a command generates with, and what it asks it for: the options
``--model``, ``--weights``, ``--prompts`` and ``--prompt`` of ``coda run``, ``coda profile``
and ``coda eval``, and what a profile records so that the commands that follow it
(``coda schedule search``, the DRA and forecast calibrations) load the same model. A
``--model`` that names a diffusers pipeline instead is
:mod:`coda.experiments.pipeline_model`'s (the options ``--negative-prompt``, ``--frames``,
``--height``, ``--width`` are its).

A prompt is an ``int`` (an index 0..9: a digit for the digits model, one of
:data:`~coda.host.model.prompts.DEMO_PROMPTS` for the text model) or a prompt text (text
model only); both models' ``conditions`` take such a list, so the commands pass it through.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coda.options import given, option

from .dit import MODELS, ShippedModel, shipped_model

__all__ = ["ModelOptions", "chosen_model", "chosen_prompts", "load_chosen", "load_profiled",
           "model_meta", "model_identity", "prompt_name", "prompt_slug", "adherence", "ADHERENCE"]

#: the prompt-adherence figures of each model (:func:`adherence`), its headline first
ADHERENCE: dict[str, tuple[str, ...]] = {
    "digits": ("label_accuracy",),
    "text": ("digit_accuracy", "direction_accuracy", "speed_accuracy", "identity_kept"),
}


@dataclass(frozen=True)
class ModelOptions:
    """The model and prompt options shared by the commands that generate (a command's
    configuration dataclass derives from it)."""
    model: str = option("digits", "the model: a shipped one, digits (label-conditioned, 4 "
                        "spatial + 4 temporal blocks) or text (prompts through a text "
                        "encoder, 8 + 8 blocks); or (coda profile, coda eval; coda schedule "
                        "search on its profile) a diffusers pipeline: a local folder (save_pretrained) or a Hub id",
                        metavar="NAME|FOLDER|ID")
    weights: Path = option(None, "the model's weights (safetensors; its configuration is the "
                           "JSON beside them)", type=Path, metavar="FILE",
                           default_text="the --model's shipped file")
    prompts: str = option("0-9", "distinct prompt indices 0..9, e.g. 0-9 or 1,4,9: digits "
                          "(digits model) or the demo prompts (text model, docs/model.md)")
    prompt: tuple = option((), "a prompt text (text model), e.g. 'a seven moving up-left "
                           "fast'; repeatable; after --prompts' prompts, or alone when "
                           "--prompts is not given; a pipeline --model's prompts",
                           type=str, action="append", metavar="TEXT")
    negative_prompt: str = option("", "a pipeline --model: the negative prompt (CFG's "
                                  "unconditional branch)", metavar="TEXT")
    frames: int = option(None, "a pipeline --model: video frames", type=int,
                         default_text="the pipeline's default")
    height: int = option(None, "a pipeline --model: video height", type=int, unit="pixels",
                         default_text="the pipeline's default")
    width: int = option(None, "a pipeline --model: video width", type=int, unit="pixels",
                        default_text="the pipeline's default")


def chosen_model(args) -> tuple[ShippedModel, Path, Path]:
    """(the :class:`ShippedModel` of ``args.model``, its weights file, its configuration
    file: ``--weights`` and the JSON beside it, or the shipped pair).
    Raises ValueError for a model that is not a shipped one (a diffusers pipeline: which
    commands take one)."""
    name = getattr(args, "model", "digits")
    if name not in MODELS:
        raise ValueError(f"--model {name}: expected a shipped model ({', '.join(MODELS)}); a "
                         "diffusers pipeline is taken by coda profile, coda schedule "
                         "search and coda eval, and coda.enable_cache(pipe) puts the cache on "
                         "it")
    chosen = shipped_model(name)
    weights = getattr(args, "weights", None)
    if weights is None:
        return chosen, chosen.weights, chosen.config_file
    weights = Path(weights)
    return chosen, weights, weights.with_suffix(".json")


def load_chosen(args, device="cpu"):
    """The model ``args`` choose (:func:`chosen_model`), in eval mode on ``device``.
    Raises FileNotFoundError naming a missing file and how to make it; ValueError when the
    file's model is not ``--model``'s kind (e.g. digits weights with ``--model text``)."""
    from .dit import load_model

    chosen, weights, config = chosen_model(args)
    model, cfg = load_model(device, weights, config)
    kind = "text" if cfg.get("conditioning") == "text" else "digits"
    if kind != chosen.name:
        raise ValueError(f"--weights {weights}: a {kind} model, expected a {chosen.name} "
                         f"model (--model {chosen.name})")
    return model


def chosen_prompts(args) -> list[int | str]:
    """The prompts ``args`` ask for: ``--prompts``' indices, then ``--prompt``'s texts (only
    the texts when ``--prompts`` is not given), each text in its canonical form.
    Raises ValueError: a pipeline ``--model`` or its options (``--frames`` ...) with a
    shipped model, a bad index list, ``--prompt`` with the digits model, a text outside
    the grammar (naming it and the forms expected), the same prompt twice, no prompt."""
    from coda.lists import parse_int_list

    from .prompts import DEMO_PROMPTS, parse_prompt

    texts = list(getattr(args, "prompt", ()) or ())
    model = getattr(args, "model", "digits")
    chosen_model(args)           # a pipeline --model: named as such, before its prompts
    for name in ("negative_prompt", "frames", "height", "width"):
        if given(args, name, "" if name == "negative_prompt" else None):
            raise ValueError(f"--{name.replace('_', '-')}: an option of a diffusers pipeline "
                             f"--model, expected none with --model {model}")
    if texts and model != "text":
        raise ValueError(f"--prompt {texts[0]!r}: prompt texts need --model text (the digits "
                         "model takes --prompts 0..9, its digits)")
    indices = ([] if texts and not given(args, "prompts", "0-9")
               else parse_int_list(args.prompts, "--prompts", 0, 9))
    canonical = [parse_prompt(t).text for t in texts]
    if any(not parse_prompt(t).digits for t in texts):
        raise ValueError("--prompt '': the empty prompt is classifier-free guidance's "
                         "unconditional branch; expected a prompt that names a digit")
    seen = [DEMO_PROMPTS[i] for i in indices] if model == "text" else []
    for text in canonical:
        if text in seen:
            raise ValueError(f"--prompt {text!r}: asked for twice (--prompts selects the demo "
                             "prompts by index, docs/model.md)")
        seen.append(text)
    return [*indices, *canonical]


def model_meta(args) -> dict:
    """What a profile (or another file made with a model) records of ``args``' model, for
    :func:`load_profiled`: ``{"model": name, "weights": path or None (the shipped file)}``."""
    chosen, weights, _ = chosen_model(args)
    return {"model": chosen.name,
            "weights": None if getattr(args, "weights", None) is None else str(weights)}


def model_identity(meta: dict) -> dict:
    """The part of a profile's metadata :func:`load_profiled` reads (``model``, ``weights``,
    ``model_hash``): small, for a Ray task's arguments."""
    return {k: meta[k] for k in ("model", "weights", "model_hash") if k in meta}


def load_profiled(meta: dict, what: str, device="cpu"):
    """The model a profile was made with (its metadata's ``model`` and ``weights``, digits
    and the shipped file for a profile that names none), checked against its
    ``model_hash``. Raises ValueError naming ``what`` (e.g. ``--profile FILE``) when the
    model's weights changed since; FileNotFoundError for missing weights."""
    from argparse import Namespace

    from coda.host.cache.profile import model_hash

    args = Namespace(model=meta.get("model", "digits"), weights=meta.get("weights"))
    model = load_chosen(args, device)
    if "model_hash" in meta and meta["model_hash"] != model_hash(model):
        raise ValueError(f"{what}: made for model {meta['model_hash']!r}, but the {args.model} "
                         f"model's weights ({args.weights or 'the shipped file'}) hash to "
                         f"{model_hash(model)!r}; profile again (coda profile --model "
                         f"{args.model})")
    return model


def prompt_name(model_name: str, prompt: int | str) -> str:
    """How reports name a prompt: ``"3"`` (a digit) or the prompt text."""
    from .prompts import DEMO_PROMPTS

    if isinstance(prompt, str):
        return prompt
    return DEMO_PROMPTS[prompt] if model_name == "text" else str(prompt)


def prompt_slug(model_name: str, prompt: int | str) -> str:
    """A file-name form of :func:`prompt_name` (words joined by ``-``)."""
    return prompt_name(model_name, prompt).replace(" ", "-")


def adherence(model, videos, prompts) -> dict:
    """Prompt adherence of ``videos`` (float [B, 1, F, H, W] in [-1, 1]) generated for
    ``prompts`` (B of :func:`chosen_prompts`' kind) by ``model``: the digits model's
    ``label_accuracy`` (:func:`coda.host.model.classifier.label_accuracy`), the text model's
    ``digit_accuracy``, ``direction_accuracy``, ``speed_accuracy`` and ``identity_kept``
    (:func:`coda.host.model.evaluate.prompt_figures`; NaN where no video asks for it).
    :data:`ADHERENCE` lists each model's figures. Raises ValueError on mismatched
    lengths."""
    import torch

    if model.config.get("conditioning") != "text":
        from .classifier import label_accuracy

        return {"label_accuracy": label_accuracy(videos, torch.as_tensor([int(p) for p in prompts]))}
    from .evaluate import prompt_figures
    from .prompts import demo_prompt, parse_prompt

    specs = [parse_prompt(p) if isinstance(p, str) else demo_prompt(p) for p in prompts]
    fig = prompt_figures(videos, specs)
    return {k: fig[k] for k in ADHERENCE["text"]}
