"""``linescope [options] (script.py | -m module) [args...]`` and ``python -m linescope``.

The target runs as under plain ``python``: its ``sys.argv``, ``sys.path[0]`` and exit status
are the same. The output is written even when the target fails. Usage errors exit 2.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from typing import Sequence


def add_profile_options(p: argparse.ArgumentParser) -> None:
    """The profile options shared by the CLI and the %%linescope cell magic."""
    p.add_argument("--backend", "-b", default=None,
                   help="profiler backend: trace (default), sampler, scalene, tachyon, or a "
                        "registered one")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpu", dest="gpu", action="store_true", default=None,
                   help="collect GPU time and device memory (needs a GPU-capable backend)")
    g.add_argument("--no-gpu", dest="gpu", action="store_false")
    p.add_argument("--memory", action="store_true", default=None,
                   help="collect host memory: RSS timeline and per-line change / peak")
    p.add_argument("-i", "--include", action="append", default=None, metavar="PATTERN",
                   help="also record files matching this glob (repeatable)")
    p.add_argument("-e", "--exclude", action="append", default=None, metavar="PATTERN",
                   help="do not record files matching this glob (repeatable)")
    p.add_argument("-r", "--root", default=None, help="project root (default: cwd)")
    p.add_argument("-o", "--output", default=None, metavar="OUT",
                   help="write the result here: .html/.htm writes the single-file HTML report, "
                        "any other suffix JSON (linescope-result/1)")
    p.add_argument("-d", "--display", choices=("none", "end"), default=None,
                   help="show the result at the end (default: end)")
    p.add_argument("--sample-rate", type=float, default=None,
                   help="samples per second, for sampling backends")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="linescope",
        usage="linescope [options] (script.py | -m module) [args...]",
        description="Profile the source lines of a Python script or module.")
    add_profile_options(p)
    p.add_argument("-m", dest="module", default=None, metavar="MODULE",
                   help="run a library module as a script (like python -m)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script.py [args...]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.module is None and not args.target:
        parser.error("give a script to run or -m MODULE")
    if args.module is not None:
        target_args = list(args.target)
    else:
        script, target_args = args.target[0], list(args.target[1:])
        if script.startswith("-"):
            parser.error(f"unknown option {script}")
        if not os.path.isfile(script):
            parser.error(f"can't open file {script!r}: no such file")

    from . import profile  # after parsing: --help stays fast

    options = {k: v for k, v in dict(
        backend=args.backend, gpu=args.gpu, memory=args.memory, root=args.root,
        include=args.include, exclude=args.exclude, output=args.output,
        display=args.display, sample_rate=args.sample_rate).items() if v is not None}
    if args.module is None:
        # The target script is always recorded, also when it lies outside the root.
        options["include"] = [*options.get("include", ()), os.path.abspath(script)]
    try:
        session = profile(**options)
    except (ValueError, TypeError) as e:
        parser.error(str(e))

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    code = 0
    if args.module is not None:
        sys.argv = [args.module, *target_args]  # runpy replaces argv[0] with the file path
        sys.path[0:1] = [os.getcwd()]
    else:
        sys.argv = [script, *target_args]
        sys.path[0:1] = [os.path.dirname(os.path.abspath(script))]
    try:
        session.start()
    except (ValueError, TypeError, RuntimeError) as e:  # nothing ran: a usage error
        sys.argv, sys.path[:] = saved_argv, saved_path
        parser.error(str(e))
    try:
        if args.module is not None:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:  # the target failed: report like python does, then still write output
        _print_target_traceback()
        code = 1
    finally:
        try:
            session.stop()
        except Exception as e:  # never mask the target's status
            print(f"linescope: could not finish the profile: {e}", file=sys.stderr)
            code = code or 1
        sys.argv, sys.path[:] = saved_argv, saved_path
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_target_traceback() -> None:
    etype, value, tb = sys.exc_info()
    # Drop linescope's and runpy's frames, as python shows only the target's.
    while tb is not None and ("runpy" in tb.tb_frame.f_code.co_filename
                              or "linescope" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(etype, value, tb)


if __name__ == "__main__":
    sys.exit(main())
