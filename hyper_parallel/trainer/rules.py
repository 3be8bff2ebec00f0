"""The rules that span root groups of a ``TrainerConfig``: each written once, as a named function.

A group checks itself (its ``cross_check``); what needs two groups is here. The resolver runs
:func:`cross_group_issues` on every resolve (``TrainerConfig.cross_check`` delegates to it) and the manager
runs :func:`world_size_issues` when the world size is known, :func:`warnings` always, and
:func:`trainer_issues` when the launcher says which trainer the config feeds (``load_config(...,
trainer="vl")``). The trainers run the same functions (:func:`trainer_issues`, :func:`layout_issues`)
on configs built in Python, which no resolver saw. Every rule yields ``(root-relative dotted path,
message)`` pairs.

Importing this module imports attrs and the component Config modules only: never torch.
"""

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Literal

from hyper_parallel._backends import BACKEND_DEVICE
from hyper_parallel._checks import counted, quote, said
from hyper_parallel.components.loss.chunking import loss_chunking
from hyper_parallel.components.lr_scheduler import WarmupDecay

if TYPE_CHECKING:  # the root config module imports this one
    from hyper_parallel.components.dataloader import DatasetConfig
    from hyper_parallel.trainer.config import TrainerConfig

__all__ = [
    "COMMANDS",
    "TRAINER_CLASSES",
    "TrainerKind",
    "batch_issues",
    "cross_group_issues",
    "data_issues",
    "expert_issues",
    "layout_issues",
    "loss_chunking_issues",
    "pipeline_issues",
    "sequence_length_issues",
    "sequence_parallel_issues",
    "stated_degree_issues",
    "step_warnings",
    "trainer_issues",
    "trainer_kind",
    "unsaved_fine_tune",
    "vocabulary_issues",
    "warnings",
    "world_size_issues",
]

Issues = Iterator[tuple[str, str]]
#: The trainer a config feeds: ``"lm"`` (text: ``train_lm``, ``LLMTrainer``) or ``"vl"`` (vision-language).
TrainerKind = Literal["lm", "vl"]
#: Each trainer as the launch commands name it.
COMMANDS: Mapping[TrainerKind, str] = {"lm": "train_lm", "vl": "train_vl"}
#: Each trainer as the classes Python code builds name it.
TRAINER_CLASSES: Mapping[TrainerKind, str] = {"lm": "LLMTrainer", "vl": "VLTrainer"}

#: Pipeline schedules that run their micro-batches in rounds of ``pp`` (their count must split into rounds).
_PP_ROUNDS = ("Interleaved1F1B", "InterleavedZeroBubble")


def cross_group_issues(cfg: "TrainerConfig") -> Issues:
    """Conflicts between root groups that hold whatever the world size (explicit degrees only; ``-1``
    waits for :func:`world_size_issues`). Settings that are not wrong but make the run pointless are
    :func:`warnings`, not errors."""
    yield from _tokenizer_issues(cfg)
    yield from cfg.peft.run_issues(cfg)  # the PEFT method states its own (none for full fine-tuning)
    yield from _compile_issues(cfg)
    yield from _activation_checkpoint_issues(cfg)
    training, par = cfg.training, cfg.parallelism
    if par.pp > 1:
        yield from pipeline_issues(cfg, par.pp)
    yield from expert_issues(cfg, {"dp_replicate": par.dp_replicate, "ep": par.ep})
    max_len = cfg.model.args.max_sequence_length()
    if max_len is not None and training.seq_len > max_len:
        yield (
            "training.seq_len",
            f"must be <= the model's max_seq_len ({max_len}), got {training.seq_len}",
        )
    yield from sequence_parallel_issues(cfg, par.tp)
    yield from loss_chunking_issues(cfg, max(par.tp, 1), max(par.pp, 1))
    yield from stated_degree_issues(cfg)
    if par.cp > 1 and training.seq_len % (2 * par.cp):
        yield (
            "training.seq_len",
            f"must be divisible by 2 * parallelism.cp ({2 * par.cp}) for load-balanced context "
            f"parallelism, got {training.seq_len}",
        )
    batch_ok = training.global_batch_size % training.micro_batch_size == 0  # else training reports it
    if batch_ok and par.dp_replicate != -1 and par.dp_shard != -1:
        yield from batch_issues(cfg, par.dp_replicate, par.dp_shard)
    yield from _backend_issues(cfg)


def loss_chunking_issues(cfg: "TrainerConfig", tp: int, pp: int) -> Issues:
    """A stated ``loss.chunk_tokens`` where the run cannot fuse the loss (``components/loss/chunking.py``:
    a model without a loss head, a VL model, tensor or pipeline parallelism, a compiled loss)."""
    refusal = loss_chunking(cfg, tp, pp).refusal
    if refusal is not None:
        yield refusal


def stated_degree_issues(cfg: "TrainerConfig") -> Issues:
    """The model's limits (``ModelArgs.parallel_issues``) on the degrees the config states, without the
    world size: ``tp: 4`` on a model of 2 key/value heads is refused by ``--dry-run`` as by the launch.

    A degree left at -1 stands at 1 here, which no model refuses, and only what is said of a stated
    degree is kept; ``pp``'s limits are :func:`pipeline_issues`' (which asks the model too).
    """
    par = cfg.parallelism
    stated = {name: getattr(par, name) for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")}
    degrees = {name: 1 if value == -1 else value for name, value in stated.items()}
    for path, message in cfg.model.args.parallel_issues(degrees):
        group, _, name = path.partition(".")
        if group == "parallelism" and name != "pp" and stated.get(name, -1) != -1:
            yield path, message


def expert_issues(cfg: "TrainerConfig", degrees: Mapping[str, int]) -> Issues:
    """Expert parallelism needs a model with experts and runs with FSDP alone (no ``dp_replicate`` yet).

    That ``ep`` divides the experts is the model's rule (``ModelArgs.parallel_issues``) and that it divides
    ``dp_shard x cp`` the parallelism group's (``ParallelismConfig.world_size_issues``).
    """
    ep = degrees.get("ep", 1)
    if ep <= 1:
        return
    if cfg.model.args.expert_count() is None:
        yield (
            "parallelism.ep",
            f"expert parallelism needs a model with experts, but {cfg.model.name} {cfg.model.flavor} is "
            "dense; use 1, or a mixture-of-experts model such as "
            f"hyper_parallel.models.qwen3_5_moe.create_model_spec, got {ep}",
        )
    replicate = degrees.get("dp_replicate", 1)
    if replicate > 1:
        yield (
            "parallelism.ep",
            f"expert parallelism with dp_replicate > 1 (HSDP, {replicate}) is not supported yet; "
            f"shard over dp_shard instead, got ep {ep}",
        )


def _tokenizer_issues(cfg: "TrainerConfig") -> Issues:
    """The tokenizer must be loadable and its ids must fit the model's embedding table."""
    tokenizer = cfg.tokenizer
    if tokenizer.needs_files() and tokenizer.path is None and cfg.model.weights_path is None:
        yield (
            "tokenizer.path",
            "is null and model.weights_path is null, so there is no tokenizer to load; set "
            "tokenizer.path to a folder holding tokenizer.json, or use "
            "hyper_parallel.components.tokenizer.ByteTokenizer.Config (needs no files)",
        )
    dataset = _training_data(cfg)
    if not tokenizer.add_eos and dataset is not None and dataset.separates_documents():
        yield (
            "tokenizer.add_eos",
            "false has no effect while dataloader.dataset.pack_sequences is true: packed documents "
            "are always separated by EOS; set pack_sequences to false or remove add_eos",
        )
    vocab = tokenizer.vocab_size()
    model_vocab = cfg.model.args.vocabulary_size()
    if dataset is not None and dataset.image_data is not None:
        yield from _image_data_issues(cfg, dataset, vocab, model_vocab)
    if vocab is not None:
        yield from vocabulary_issues(cfg, vocab)
    yield from sequence_length_issues(cfg, getattr(tokenizer, "model_max_length", None))


def vocabulary_issues(cfg: "TrainerConfig", vocab: int) -> Issues:
    """The model's embedding table must hold every id of a tokenizer of ``vocab`` ids.

    At resolve time for tokenizers whose size the config fixes (``ByteTokenizer``); the trainer asks again
    with the loaded tokenizer's size, before the model is built.
    """
    model_vocab = cfg.model.args.vocabulary_size()
    if model_vocab is not None and vocab > model_vocab:
        nested = "text." if hasattr(cfg.model.args, "text") else ""  # vision-language arguments
        yield (
            f"model.overrides.{nested}vocab_size",
            f"the model embeds {model_vocab} token ids but the tokenizer produces {vocab}; set "
            f"model.overrides.{nested}vocab_size to at least {vocab}",
        )


def sequence_length_issues(cfg: "TrainerConfig", longest: int | None, *, from_files: bool = False) -> Issues:
    """``training.seq_len`` must not exceed the tokenizer's ``model_max_length`` (None: unbounded).

    At resolve time for the config's ``tokenizer.model_max_length``; the launch and ``--dry-run`` ask again
    with the loaded tokenizer's (``from_files``: the value its ``tokenizer_config.json`` holds), before the
    data loader would refuse it.
    """
    seq_len = cfg.training.seq_len
    if longest is None or seq_len <= longest:
        return
    held = "its tokenizer_config.json's model_max_length" if from_files else "tokenizer.model_max_length"
    yield (
        "training.seq_len",
        f"{seq_len} exceeds {held} ({longest}); lower training.seq_len, or set tokenizer.model_max_length "
        f"to at least {seq_len} if the model takes sequences that long",
    )


def unsaved_fine_tune(cfg: "TrainerConfig", *, off_by_choice: bool) -> Issues:
    """A run that fine-tunes (a ``peft`` method other than full fine-tuning, or ``model.weights_path``)
    with checkpointing off saves nothing of what it trains: said at ``checkpoint.enable``.

    Checkpointing is off by default, so such a run is an error unless the config wrote
    ``checkpoint.enable: false`` itself (``off_by_choice``: in the file or by a flag, which only the
    launcher knows from the resolve's provenance); then the same finding is a warning. The launcher runs it
    (``--dry-run`` and the launch alike); a config built in Python has no provenance and is not asked.
    """
    if getattr(cfg.checkpoint, "enable", True):
        return
    reasons = []
    if cfg.peft.trains_adapters:
        reasons.append(f"peft is {type(cfg.peft).__qualname__.removesuffix('.Config')}")
    if cfg.model.weights_path is not None:
        reasons.append("model.weights_path is set")
    if not reasons:
        return
    why = " and ".join(reasons)
    if off_by_choice:
        yield "checkpoint.enable", f"is false: this run fine-tunes ({why}) and saves nothing it trains"
    else:
        yield (
            "checkpoint.enable",
            f"is false by default, so this run, which fine-tunes ({why}), would save nothing it trains; "
            "set checkpoint.enable: true (and checkpoint.folder) to keep the result, or write "
            "checkpoint.enable: false to train without saving",
        )


def _training_data(cfg: "TrainerConfig") -> "DatasetConfig | None":
    """The training data's section (a data loader without one reads no dataset section)."""
    return getattr(cfg.dataloader, "dataset", None)


def _has_vision(cfg: "TrainerConfig") -> bool:
    return getattr(cfg.model.args, "vision", None) is not None


def trainer_kind(cfg: "TrainerConfig") -> TrainerKind:
    """The trainer that trains ``cfg``'s model: ``"vl"`` for a vision-language model, else ``"lm"``."""
    return "vl" if _has_vision(cfg) else "lm"


def _image_data_issues(
    cfg: "TrainerConfig", dataset: "DatasetConfig", vocab: int | None, model_vocab: int | None
) -> Issues:
    """Image data needs a vision tower and a placeholder id the tokenizer never produces."""
    image_token_id = getattr(cfg.model.args, "image_token_id", None)
    if not _has_vision(cfg) or image_token_id is None:
        yield (
            "dataloader.dataset.source",
            f"{dataset.source!r} produces images, but {cfg.model.name!r} has no vision tower; use a "
            "vision-language model (hyper_parallel.models.qwen3_5.create_vl_model_spec) and train_vl",
        )
        return
    if model_vocab is not None and image_token_id >= model_vocab:
        yield (
            "model.overrides.image_token_id",
            f"must be < the model's vocabulary size ({model_vocab}), got {image_token_id}",
        )
    if vocab is not None and image_token_id < vocab:
        yield (
            "model.overrides.image_token_id",
            f"must not be an id the tokenizer produces (0..{vocab - 1}), got {image_token_id}",
        )


def _compile_issues(cfg: "TrainerConfig") -> Issues:
    """Compiling the model needs a backend the model supports, and no pipeline parallelism."""
    if not (cfg.compile.enable and "model" in cfg.compile.components):
        return
    compile_issue = cfg.model.args.compile_issue(cfg.compile.backend)
    if compile_issue is not None:
        yield "compile.backend", compile_issue
    if cfg.parallelism.pp > 1:
        yield (
            "compile.enable",
            "compiling the model is not supported with pipeline parallelism "
            f"(parallelism.pp = {cfg.parallelism.pp})",
        )
    if cfg.compile.fullgraph and cfg.model.args.expert_count() is not None:
        yield (
            "compile.fullgraph",
            "a mixture-of-experts model compiles with graph breaks only (its grouped expert matmul runs "
            "eagerly outside bfloat16, and under expert parallelism the all-to-all reads its split sizes "
            "on the host); use fullgraph: false",
        )


def _activation_checkpoint_issues(cfg: "TrainerConfig") -> Issues:
    """Selective checkpointing every n-th block needs at least n blocks."""
    n_layers = cfg.model.args.num_layers()
    option = cfg.activation_checkpoint.selective_option
    if (
        n_layers is not None
        and cfg.activation_checkpoint.mode == "selective"
        and isinstance(option, int)
        and option > n_layers
    ):
        yield (
            "activation_checkpoint.selective_option",
            f"checkpoints every {_ordinal(option)} block but the model has only "
            f"{counted(n_layers, 'block')}, so nothing would be checkpointed",
        )


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    tens = n % 100 in (11, 12, 13)
    return f"{n}{'th' if tens else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _backend_issues(cfg: "TrainerConfig") -> Issues:
    """A device-specific backend runs on its own devices only."""
    backend, device = cfg.comm.backend, cfg.training.init_device
    if backend in BACKEND_DEVICE and device in BACKEND_DEVICE.values() and BACKEND_DEVICE[backend] != device:
        yield (
            "comm.backend",
            f"{backend!r} does not run on {device!r} devices (training.init_device); "
            "use null to pick the backend automatically",
        )


def batch_issues(
    cfg: "TrainerConfig", dp_replicate: int, dp_shard: int, world_size: int | None = None
) -> Issues:
    """The global batch is a whole number of micro-batches on every data-parallel rank (``world_size``,
    when given, is named in the message)."""
    training = cfg.training
    per_step = training.micro_batch_size * dp_replicate * dp_shard
    if training.global_batch_size % per_step:
        ranks = f" on {world_size} ranks" if world_size is not None else ""
        yield (
            "training.global_batch_size",
            f"must be a multiple of micro_batch_size x dp_replicate x dp_shard ({per_step}{ranks}), "
            f"got {training.global_batch_size}",
        )


def sequence_parallel_issues(cfg: "TrainerConfig", tp: int) -> Issues:
    """``sequence_parallel`` under ``tp`` > 1 splits the residual stream along the sequence: the model
    needs a plan for it, and ``training.seq_len`` must split evenly over the ``tp`` ranks."""
    if tp <= 1 or not cfg.parallelism.sequence_parallel:
        return
    if not cfg.model.args.supports_sequence_parallel():
        yield (
            "parallelism.sequence_parallel",
            f"is not supported yet by {cfg.model.name} (its tensor-parallel plan keeps activations "
            "replicated); set it to false",
        )
    elif cfg.training.seq_len % tp:
        yield (
            "training.seq_len",
            said(
                "must be divisible by ",
                quote("parallelism.tp", tp),
                " for sequence parallelism (each tp rank holds an equal slice of the sequence; or set "
                f"parallelism.sequence_parallel to false), got {cfg.training.seq_len}",
            ),
        )


def pipeline_issues(cfg: "TrainerConfig", pp: int) -> Issues:
    """Pipeline parallelism over ``pp`` ranks.

    Every stage needs a block; each training micro-batch (one pipeline step) must split into the
    schedule's micro-batches, in a number the schedule accepts; validation runs unpipelined.
    """
    if pp <= 1:
        return
    par, schedule = cfg.parallelism, cfg.parallelism.pp_schedule
    per_rank = par.pipeline_stages_per_rank()
    n_layers = cfg.model.args.num_layers()
    if n_layers is not None and n_layers < pp * per_rank:
        if per_rank == 1:
            yield (
                "parallelism.pp",
                f"must be <= the model's {counted(n_layers, 'layer')}, got {counted(pp, 'stage')}",
            )
        else:
            yield (
                "parallelism.pp_schedule",
                f"{schedule} holds {per_rank} stages per pipeline rank, so pp = {pp} needs "
                f"{pp * per_rank} stages of at least one layer, but the model has "
                f"{counted(n_layers, 'layer')}; use 1F1B or GPipe, or a smaller pp",
            )
    count = par.pipeline_microbatches(pp)
    micro = cfg.training.micro_batch_size
    if micro % count and par.pp_microbatches is None:
        yield (
            "training.micro_batch_size",
            said(
                "must be a multiple of ",
                quote("parallelism.pp", pp, "pp"),
                " under pipeline parallelism: each micro-batch is one pipeline step, split into "
                f"parallelism.pp_microbatches (null: pp) micro-batches, got {micro}",
            ),
        )
    elif micro % count:
        yield (
            "parallelism.pp_microbatches",
            said(
                "must divide ",
                quote("training.micro_batch_size", micro),
                ": each training micro-batch is one pipeline step split into this many micro-batches, "
                f"got {count}",
            ),
        )
    if schedule == "1F1B" and count < pp:
        yield (
            "parallelism.pp_microbatches",
            said(
                "1F1B needs at least ",
                quote("parallelism.pp", pp, "pp"),
                f" micro-batches per pipeline step, got {count}",
            ),
        )
    rounds = max(1, count // pp)
    if schedule in _PP_ROUNDS and count % rounds:
        yield (
            "parallelism.pp_microbatches",
            said(
                f"{schedule} runs the micro-batches in {counted(rounds, 'round')} (pp_microbatches // pp), "
                f"so it must be a multiple of {rounds}, got {count}; a multiple of ",
                quote("parallelism.pp", pp, "pp"),
                " always works",
            ),
        )
    degrees = {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": pp, "ep": 1}
    yield from (i for i in cfg.model.args.parallel_issues(degrees) if i[0] == "parallelism.pp")
    if cfg.validator.enable:
        yield (
            "validator.enable",
            f"validation is not supported yet with pipeline parallelism (parallelism.pp = {pp}); set "
            "it to false",
        )


def world_size_issues(cfg: "TrainerConfig", world_size: int) -> list[tuple[str, str]]:
    """Running on ``world_size`` ranks.

    Once the degrees resolve: auto degrees that land on a layout not supported yet, the model's own
    limits (``ModelArgs.parallel_issues``: heads vs ``tp`` ...) and the batch geometry.
    """
    par = cfg.parallelism
    issues = [(f"parallelism.{p}", m) for p, m in par.world_size_issues(world_size)]
    if issues:
        return issues
    degrees = par.resolved_degrees(world_size)
    issues.extend((f"parallelism.{p}", m) for p, m in par.unsupported_degrees(degrees))
    issues.extend(cfg.model.args.parallel_issues(degrees))
    if par.dp_replicate == -1:  # explicit degrees were checked by cross_group_issues
        issues.extend(i for i in expert_issues(cfg, degrees) if i not in issues)
    issues.extend(sequence_parallel_issues(cfg, degrees["tp"]))
    if par.pp == -1:  # explicit degrees were checked by cross_group_issues
        issues.extend(i for i in pipeline_issues(cfg, degrees["pp"]) if i not in issues)
    if par.tp == -1 or par.pp == -1:
        issues.extend(i for i in loss_chunking_issues(cfg, degrees["tp"], degrees["pp"]) if i not in issues)
    auto = {name: value for name, value in degrees.items() if getattr(par, name, None) == -1}
    issues.extend(cfg.peft.layout_issues(cfg, auto))
    # The batch rule as cross_group_issues runs it, now with every degree known (named with the ranks);
    # with both data-parallel degrees explicit, cross_group_issues has already run it.
    if par.dp_replicate == -1 or par.dp_shard == -1:
        issues.extend(batch_issues(cfg, degrees["dp_replicate"], degrees["dp_shard"], world_size))
    return issues


def trainer_issues(
    cfg: "TrainerConfig", trainer: TrainerKind | None, names: Mapping[TrainerKind, str] = COMMANDS
) -> Issues:
    """What the trainer a config feeds needs: a vision-language model for ``"vl"``, text data for
    ``"lm"`` (None: no trainer is known, nothing to check). ``names`` says what the trainers are called
    where the config is refused (the launch commands, or :data:`TRAINER_CLASSES` for Python code)."""
    if trainer == "vl" and not _has_vision(cfg):
        yield (
            "model",
            f"{names['vl']} needs a vision-language model, but {cfg.model.name!r} has no vision tower; "
            f"use a VL factory such as hyper_parallel.models.qwen3_5.create_vl_model_spec, or {names['lm']}",
        )
    if trainer is not None:
        yield from data_issues(cfg)
    dataset = _training_data(cfg)
    if trainer == "lm" and dataset is not None and dataset.image_data is not None:
        yield (
            "dataloader.dataset.source",
            f"{dataset.source!r} is {dataset.image_data}, which {names['lm']} cannot feed; use {names['vl']}",
        )


#: What a config that names no data is told (random tokens are only ever trained on by name).
NO_DATA = (
    "names no training data: set dataloader.dataset.source with its paths ('jsonl', 'text' or "
    "'tokenized'), or 'python_docs'; random tokens only by name: source: synthetic"
)


def data_issues(cfg: "TrainerConfig") -> Issues:
    """Training needs data named by the config: a dataset section without a ``source`` is refused (it once
    meant random tokens, which trained a whole run on noise without a word)."""
    dataset = _training_data(cfg)
    if dataset is not None and not dataset.names_data:
        yield "dataloader.dataset", NO_DATA
    validator = cfg.validator
    held: DatasetConfig | None = getattr(validator, "dataset", None)
    if validator.enable and held is not None and not held.names_data:
        yield (
            "validator.dataset",
            "names no validation data: set validator.dataset.source (and its paths), or set "
            "validator.enable to false",
        )
    if validator.enable and held is not None and held.image_data is not None:
        yield (
            "validator.dataset.source",
            f"{held.source!r} is {held.image_data}, which validation cannot feed yet (it passes the "
            "model tokens only); validate on text data, or set validator.enable to false",
        )


def layout_issues(cfg: "TrainerConfig", degrees: Mapping[str, int]) -> Issues:
    """What a trainer refuses once the launch fixed the ``degrees``: the layout rules the resolver runs,
    which a config built in Python never met (degrees not supported yet, sequence and pipeline
    parallelism, QLoRA's layouts)."""
    yield from ((f"parallelism.{p}", m) for p, m in cfg.parallelism.not_supported_yet(degrees))
    yield from expert_issues(cfg, degrees)
    yield from ((p, m) for p, m in cfg.model.args.parallel_issues(degrees) if p == "parallelism.ep")
    yield from sequence_parallel_issues(cfg, degrees["tp"])
    yield from pipeline_issues(cfg, degrees["pp"])
    yield from loss_chunking_issues(cfg, degrees["tp"], degrees["pp"])
    yield from cfg.peft.layout_issues(cfg, degrees)


def warnings(cfg: "TrainerConfig") -> Issues:
    """Settings that make the run pointless but not wrong.

    The run starts all the same (``load_config(strict=True)`` and ``--strict`` refuse it): a warmup or a
    decay that does not fit in ``training.max_steps`` (warmup keeps its length, the decay is shortened),
    and validation, profiling or metrics whose period exceeds the run, so they never run. A run by
    ``training.epochs`` has no step count yet: the trainer asks :func:`step_warnings` once the data is
    loaded.
    """
    if cfg.training.max_steps is not None:
        yield from step_warnings(cfg, cfg.training.max_steps)


def step_warnings(cfg: "TrainerConfig", max_steps: int, steps: str = "training.max_steps") -> Issues:
    """:func:`warnings` for a run of ``max_steps`` optimizer steps (``steps``: what gives that count)."""
    sched = cfg.lr_scheduler
    if sched.warmup_steps > max_steps:
        yield (
            "lr_scheduler.warmup_steps",
            said("must be <= ", quote(steps, max_steps), f", got {sched.warmup_steps}"),
        )
    elif isinstance(sched, WarmupDecay.Config) and sched.decay_ratio is not None:
        decay = sched.decay_steps(max_steps)
        if sched.warmup_steps + decay > max_steps:
            yield (
                "lr_scheduler.decay_ratio",
                said(
                    quote("lr_scheduler.warmup_steps", sched.warmup_steps, "warmup_steps"),
                    f" plus the decay phase ({counted(decay, 'step')} = decay_ratio x {max_steps}) exceeds ",
                    quote(steps, max_steps),
                    f"; the decay is shortened to {counted(max_steps - sched.warmup_steps, 'step')}",
                ),
            )
    if cfg.validator.enable and cfg.validator.freq > max_steps:
        yield (
            "validator.freq",
            said(
                "validation would never run: ",
                quote("validator.freq", cfg.validator.freq, "freq"),
                " exceeds ",
                quote(steps, max_steps),
            ),
        )
    if cfg.profiler.enable and cfg.profiler.profile_freq > max_steps:
        yield (
            "profiler.profile_freq",
            said(
                "no trace would be captured: ",
                quote("profiler.profile_freq", cfg.profiler.profile_freq, "profile_freq"),
                " exceeds ",
                quote(steps, max_steps),
            ),
        )
    if cfg.metrics.log_freq > max_steps:
        yield (
            "metrics.log_freq",
            said(
                "no metrics would be logged: ",
                quote("metrics.log_freq", cfg.metrics.log_freq, "log_freq"),
                " exceeds ",
                quote(steps, max_steps),
            ),
        )
