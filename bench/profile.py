"""`python -m bench.profile model=<m> [device=...] [gen.batch_size=B] [engine.compile=on|off] [profile.force=true]`:
measure the target's forward times t(L, c) for the cost model (bench/planning/profile.py), unless a profile for this
setting exists; compiled or eager as engine.compile decides for a run of the same overrides.

The arguments are overrides of conf/config.yaml, as `python -m bench` takes them (composed, not run as a Hydra job:
nothing is written but the profile)."""
from __future__ import annotations

import argparse

from bench.config import compose_config
from bench.errors import exit_on_user_error


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="key=value: model=, device=, gen.batch_size=, profile.*, ...")
    return parser


def main(argv: list[str] | None = None) -> None:
    overrides = command_line().parse_args(argv).overrides
    from bench.models import load_model, resolve_device
    from bench.planning.costmodel import ProfileError
    from bench.planning.profile import find_profile, make_profile, origin_text, print_profile, profile_origin
    from bench.validate import validate

    with exit_on_user_error(ProfileError):
        cfg = compose_config(*overrides)
        device = resolve_device(validate(cfg).device)
        if not cfg.profile.force:
            try:
                profile = find_profile(cfg, device)
                print(f"a profile for this setting exists: {origin_text(profile_origin(cfg, profile))}; "
                      f"profile.force=true remakes it on this host")
                print_profile(profile)
                return
            except ProfileError:
                pass
        model, _ = load_model(cfg.model, device)
        print_profile(make_profile(cfg, model, device))


if __name__ == "__main__":
    main()
