"""Servers the harness starts itself (server.launch / server.baseline_launch): a shell command in its own process
group, its output kept in the run folder, ready once its health endpoint answers, stopped by its pid at the end."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
import urllib.error
from pathlib import Path

from omegaconf import DictConfig

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_checked
from bench.errors import ConfigError, MissingArtifactError
from bench.measure.serving.http import get_text
from bench.models import dequantized_gguf, model_folder
from methods.sps.draft import standalone_draft

POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 10.0


def check_binary(command: str, hint: str | None) -> None:
    """Refuse a launch command whose program (its first word, a path) is not an executable file, with `hint`."""
    program = Path(shlex.split(command)[0]).expanduser()
    if program.parent != Path(".") and not os.access(program, os.X_OK):
        raise MissingArtifactError(f"server program {program} not found (server.launch); "
                                   f"{hint or 'install it or set server.launch=<command>'}")


def launch_command(cfg: DictConfig, command: str) -> str:
    """A launch command with its placeholders filled (fill_placeholders), its program checked to exist."""
    filled = fill_placeholders(cfg, command)
    check_binary(filled, cfg.server.build_hint)
    return filled


def fill_placeholders(cfg: DictConfig, command: str) -> str:
    """A launch command or environment value with its placeholders filled: {binary} (server.binary, checked to
    exist), {model_file} (the model's GGUF), {model_dir} (the model's safetensors folder: model.path, or the GGUF's
    dequantized copy), {draft_dir} (draft_of's folder, made loadable on its own: methods/sps/draft.standalone_draft) and
    {cpus} (every core of this machine, 0-N). Placeholders are replaced by name, so JSON braces stay as written."""
    server = cfg.server
    fills = {"{binary}": lambda: str(Path(server.binary).expanduser()) if server.binary else "",
             "{model_file}": lambda: str(model_folder(cfg.model) / (cfg.model.get("gguf_file") or "")),
             "{model_dir}": lambda: str(model_weights_dir(cfg.model)),
             "{draft_dir}": lambda: str(standalone_draft(draft_of(cfg), model_weights_dir(cfg.model))),
             "{cpus}": lambda: f"0-{(os.cpu_count() or 1) - 1}"}
    for placeholder, fill in fills.items():
        if placeholder in command:
            command = command.replace(placeholder, fill())
    return command


def launch_environment(cfg: DictConfig) -> dict[str, str]:
    """The launched servers' environment: this process's, plus server.env with its placeholders filled."""
    extra = {str(k): fill_placeholders(cfg, str(v)) for k, v in (cfg.server.get("env") or {}).items()}
    return {**os.environ, **extra}


def model_weights_dir(model: DictConfig) -> Path:
    """The model as a safetensors folder a serving engine loads: model.path, or the GGUF's dequantized copy."""
    return dequantized_gguf(model) if model.get("gguf_file") else Path(model.path).expanduser()


def draft_of(cfg: DictConfig) -> str:
    """The draft or head folder a launch command names as {draft_dir}: server.draft, else the one that
    method=<server.draft_of> runs on this model (its drafter's checkpoint or draft_path)."""
    server = cfg.server
    if server.get("draft"):
        return str(server.draft)
    if not server.get("draft_of"):
        raise ConfigError(f"server={server.name}: its launch names {{draft_dir}}; set server.draft=<folder> or "
                          f"server.draft_of=<method>")
    drafter = compose_checked("config", [f"method={server.draft_of}", f"model={cfg.model.name}"]).method.drafter
    folder = drafter.get("checkpoint") or drafter.get("draft_path")
    if not folder or folder == "???":
        raise ConfigError(f"method={server.draft_of} has no draft or head for model={cfg.model.name} "
                          f"(conf/method_model/{server.draft_of}/); set server.draft=<folder>")
    return str(folder)


class LaunchedServer:
    """`with LaunchedServer(command, url, health_path, log, deadline, env):` starts `command` (shell, own process
    group, in the project root, with environment `env` (default: this process's), stdout and stderr to `log`),
    waits until GET url+health_path answers 200 (MissingArtifactError after `deadline` seconds or when the process
    exits first, naming the log) and stops the group on leaving, also after an exception or Ctrl-C: SIGTERM, then
    SIGKILL after STOP_GRACE_SECONDS. Refuses to start when something already answers at url: the launched server
    could not bind its port, and the run would measure whatever holds it."""

    def __init__(self, command: str, url: str, health_path: str, log: Path, deadline: float,
                 env: dict[str, str] | None = None):
        self.command, self.url, self.health_path, self.log, self.deadline = command, url, health_path, log, deadline
        self.env = env
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LaunchedServer":
        if answers(self.url + self.health_path):
            raise ConfigError(f"something already answers at {self.url}, where server.launch would start its "
                              f"server: stop it (another run's server?), or give this run other ports (the URL "
                              f"and the launch command's --port), or measure it as it is (server.launch=null)")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            log.write(f"$ {self.command}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.command, shell=True, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            cwd=PROJECT_ROOT, env=self.env)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self) -> None:
        """Poll the health endpoint until it answers 200, the process exits, or the deadline passes."""
        give_up = time.monotonic() + self.deadline
        while True:
            if self.process.poll() is not None:
                raise MissingArtifactError(f"server command exited with status {self.process.returncode} before "
                                           f"{self.url} was ready (server.launch); its output: {self.log}")
            if answers(self.url + self.health_path):  # not yet: 503 while loading, or not listening
                return
            if time.monotonic() > give_up:
                raise MissingArtifactError(f"server at {self.url} not ready after {self.deadline:.0f} s "
                                           f"(server.ready_timeout_s; health: {self.health_path}); its output: "
                                           f"{self.log}")
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        """End the server's process group (by the pid it was started with), reap it and wait until no process of
        the group is left: the shell may exit before the server it started has closed its port."""
        process, self.process = self.process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, STOP_GRACE_SECONDS)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            give_up = time.monotonic() + wait
            try:
                process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if wait_group_gone(process.pid, give_up):
                return
        process.wait()


def answers(url: str) -> bool:
    """Whether GET url answers 200 within 2 s."""
    try:
        get_text(url, timeout=2.0)
        return True
    except (urllib.error.URLError, OSError):
        return False


def wait_group_gone(group: int, give_up: float) -> bool:
    """Poll until process group `group` has no process left (True) or time.monotonic() passes `give_up` (False)."""
    while time.monotonic() < give_up:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False
