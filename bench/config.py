"""The configuration as every command composes it: conf/ with the command line's overrides, an unknown config choice
or key refused in one line before Hydra composes, and the old spellings folded into today's keys (the one place)."""
from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench import DEPRECATED_SIZING, SIZINGS, deprecated_meaning, sizing_of
from bench.artifacts import PROJECT_ROOT
from bench.errors import ConfigError, MissingArtifactError, exit_on_user_error
from bench.run_folder import settings_label

CONF_DIR = PROJECT_ROOT / "conf"
COMMAND_VARIABLE = "SPECBENCH_COMMAND"  # the command line a run or sweep was started with, inherited by its jobs


def typed_command(argv: list[str] | str | None = None) -> str:
    """A command line as a user types it: `python -m ...`, the interpreter's path left out (this process's, or the
    given argv or command string)."""
    words = list(sys.orig_argv if argv is None else shlex.split(argv) if isinstance(argv, str) else argv)
    if words and Path(words[0]).name.startswith("python"):
        words[0] = "python"
    return shlex.join(words)
NOUNS = {"train": "methods with a training recipe"}  # how a choice listing names a folder's files; else <folder>s


if not OmegaConf.has_resolver("settings_label"):  # conf/config.yaml's out_dir: the settings that decide the answers
    OmegaConf.register_new_resolver("settings_label", lambda *, _root_: settings_label(_root_))


def preferred_dtype() -> str:
    """bfloat16 where the CPU has bfloat16 matrix instructions (AMX-BF16, AVX512-BF16), else float32: a model
    config's `dtype: ${preferred_dtype:}`."""
    from bench.models import cpu_bfloat16_support

    return "bfloat16" if cpu_bfloat16_support() else "float32"


if not OmegaConf.has_resolver("preferred_dtype"):
    OmegaConf.register_new_resolver("preferred_dtype", preferred_dtype)


def compose_config(*overrides: str, return_hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml with Hydra `overrides`, as `python -m bench ...` composes it, without running anything."""
    refuse_unknown_choices(overrides)
    return fold_deprecated(compose_checked("config", list(overrides), return_hydra_config))


def _compose(config_name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """Composed in the running Hydra app's config folder (inside `python -m bench`), else in CONF_DIR."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)


def fold_deprecated(cfg: DictConfig) -> DictConfig:
    """`cfg` with each old spelling that is set folded into the key that replaced it, one stderr warning each, and set
    to null (a second fold says nothing): `method.budget` and `method.batch_policy` into method.sizing (auto when any
    spelling says auto), `train.max_minutes` into train.minutes (it wins, as it always did). An old spelling's value
    that means nothing, or that asks vanilla for sizing, is refused (ConfigError); a bad method.sizing is left for
    bench.validate to name."""
    if cfg.get("method") is not None:
        _fold_sizing(cfg.method)
    train = cfg.get("train")
    if train is not None and train.get("max_minutes") is not None:
        _warn("train.max_minutes", train.max_minutes, "train.minutes", train.max_minutes)
        train.minutes, train.max_minutes = train.max_minutes, None
    return cfg


def _fold_sizing(method: DictConfig) -> None:
    given = {key: method.get(key) for key in DEPRECATED_SIZING if method.get(key) is not None}
    problems = [f"method.{key}={value}: must be {' or '.join(DEPRECATED_SIZING[key])} (deprecated: method.sizing)"
                for key, value in given.items() if deprecated_meaning(method, key) is None]
    if "sizing" not in method:  # vanilla
        problems += [f"method.{key}={value}: method={method.name} drafts nothing, so there is nothing to size"
                     for key, value in given.items() if deprecated_meaning(method, key) == "auto"]
    if problems:
        raise ConfigError("\n".join(problems))
    if not given or method.get("sizing") not in SIZINGS:  # a bad sizing: bench.validate names it
        return
    for key, value in given.items():
        _warn(f"method.{key}", value, "method.sizing", deprecated_meaning(method, key))
    method.sizing = sizing_of(method)
    for key in given:
        method[key] = None


def _warn(old_key: str, old_value, new_key: str, new_value) -> None:
    print(f"warning: {old_key}={old_value} is deprecated: use {new_key}={new_value}", file=sys.stderr)


def config_choices(folder: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The names a config group takes from conf/<folder>/*.yaml (conf/method/ -> eagle, eagle2, ..., vanilla)."""
    return sorted(path.stem for path in (conf_dir / folder).glob("*.yaml"))


if not OmegaConf.has_resolver("config_choices"):  # the commands' --help (conf/hydra/help/) lists a group's choices
    OmegaConf.register_new_resolver("config_choices", lambda folder: ", ".join(config_choices(folder)))


def unknown_choice(group: str, name: str, folder: str | None = None) -> str | None:
    """`method=pdl: no conf/method/pdl.yaml; methods: eagle, ...` when `name` has no YAML in conf/<folder> (the
    group's own by default), else None."""
    folder = folder or group
    choices = config_choices(folder)
    if name in choices:
        return None
    return f"{group}={name}: no conf/{folder}/{name}.yaml; {NOUNS.get(folder, folder + 's')}: {', '.join(choices)}"


def unknown_choices(overrides: Iterable[str], folders: Mapping[str, str] | None = None) -> list[str]:
    """One line per config choice among Hydra `overrides` (`method=pdl`, each name of a sweep `task=qa,nosuch`) with
    no YAML file. A group's choices are conf/<group>/*.yaml, or the folder `folders` maps it to (bench.train: method
    -> train); Hydra's own groups and glob sweeps are left to Hydra, as is an override Hydra cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return []
    problems = []
    for override in parsed:
        group = override.key_or_group
        folder = (folders or {}).get(group, group)
        if group.startswith("hydra") or not (CONF_DIR / folder).is_dir() or override.is_delete() or \
                override.value_type is not None and override.value_type.name == "GLOB_CHOICE_SWEEP":
            continue
        names = override.sweep_string_iterator() if override.is_sweep_override() else [override.value()]
        problems += [line for name in names if name is not None
                     for line in [unknown_choice(group, str(name), folder)] if line]
    return problems


def missing_launcher(overrides: Iterable[str]) -> str | None:
    """`hydra/launcher=<name>: needs the <plugin> plugin: pip install -e ".[sweeps]"` when the overrides name a
    conf/hydra/launcher/ config whose Hydra plugin is not installed (Hydra would end in an "Unknown plugin class"
    traceback), else None."""
    from importlib import import_module

    from omegaconf import OmegaConf

    for override in overrides:
        key, _, name = override.lstrip("+").partition("=")
        path = CONF_DIR / "hydra" / "launcher" / f"{name}.yaml"
        if key != "hydra/launcher" or not path.is_file():
            continue
        target_module = str(OmegaConf.load(path)._target_).rsplit(".", 1)[0]
        plugin = ".".join(target_module.split(".")[:2])  # hydra_plugins.<package>
        if plugin_installed(plugin):  # one of ours names the plugin it runs
            plugin = getattr(import_module(target_module), "REQUIRES", plugin)
        if not plugin_installed(plugin):
            distribution = plugin.split(".")[1].replace("_", "-")
            return f'{override}: needs the {distribution} plugin: pip install -e ".[sweeps]"'
    return None


def plugin_installed(package: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(package) is not None
    except ModuleNotFoundError:  # no hydra_plugins namespace at all
        return False


def refuse_unknown_choices(overrides: Iterable[str], folders: Mapping[str, str] | None = None) -> None:
    if problems := unknown_choices(overrides, folders):
        raise ConfigError("\n".join(problems))


def compose_checked(config_name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """conf/<config_name>.yaml composed with `overrides` (not a sweep), where what Hydra refuses with a page is
    refused in one line (ConfigError): an override of a key the config lacks; of a drafter knob, naming its drafter's
    knobs. Other composition errors are Hydra's."""
    from hydra.errors import HydraException

    try:
        return _compose(config_name, overrides, return_hydra_config)
    except HydraException as err:
        key = getattr(err.__cause__, "full_key", None)
        given = next((o for o in overrides if key and o.split("=", 1)[0] == key), None)
        if given is None:
            raise
    if key.startswith("method.drafter."):  # as a new key, for the drafter's own check to name
        from bench.validate import drafter_problems

        added = [f"+{o}" if o == given else o for o in overrides]
        if problems := drafter_problems(_compose(config_name, added).method):
            raise ConfigError("\n".join(problems))
    raise ConfigError(f"{given}: the config has no key {key} (+{given} adds one)")


def unknown_keys(config_name: str, overrides: list[str]) -> list[str]:
    """compose_checked's one-line refusal of `overrides`, if any (other composition errors are left to Hydra)."""
    from hydra.errors import HydraException

    if any(o.lstrip("+~").startswith("hydra") for o in overrides):
        return []  # Hydra's own settings: only a Hydra app composes them
    try:
        compose_checked(config_name, overrides)
    except ConfigError as err:
        return str(err).splitlines()
    except HydraException:
        pass
    return []


def command_line_overrides(argv: list[str]) -> tuple[list[str], bool]:
    """(the Hydra overrides of a command line, whether it is a multirun), split from Hydra's flags by its own
    parser."""
    from argparse import ArgumentError

    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        args, rest = parser.parse_known_args(argv)
    except ArgumentError:  # Hydra says what is wrong
        return [], True
    return [*args.overrides, *(a for a in rest if not a.startswith("-"))], args.multirun


def flags_first(argv: list[str]) -> list[str]:
    """`argv` with Hydra's flags before every override: Hydra's parser takes one run of overrides, so
    `+experiment=x -m method=a,b` (as conf/experiment/*.yaml's comments write it) was refused for its last ones."""
    overrides, _ = command_line_overrides(argv)
    left, flags = list(overrides), []
    for word in argv:
        if word in left:
            left.remove(word)
        else:
            flags.append(word)
    return [*flags, *overrides]


def run_hydra_command(app: Callable[[DictConfig], None], config_name: str,
                      folders: Mapping[str, str] | None = None) -> None:
    """Run `app` as the Hydra app over conf/<config_name>.yaml on this process's command line, once its config
    choices and keys are known good, and a launcher it names is installed: an unknown one is `error: <line>` and exit
    status 2, before Hydra composes."""
    import hydra

    overrides, multirun = command_line_overrides(sys.argv[1:])
    with exit_on_user_error():
        refuse_unknown_choices(overrides, folders)
        if problem := missing_launcher(overrides):
            raise MissingArtifactError(problem)
        if not multirun and (problems := unknown_keys(config_name, overrides)):
            raise ConfigError("\n".join(problems))
    os.environ[COMMAND_VARIABLE] = typed_command()  # for meta.json, in this process and a sweep's jobs
    sys.argv[1:] = flags_first(sys.argv[1:])
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(app)()
