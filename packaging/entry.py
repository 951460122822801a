"""Entry point of the packaged (frozen) app: ``tandem`` in dist/tandem/.

``multiprocessing.freeze_support()`` must run before anything else: the engine runs in a ``spawn``
child process, which in a frozen app is this same executable started with multiprocessing's arguments;
freeze_support() turns that start into the child's bootstrap and never returns there.
``--self-test`` is handled here too, before app.cli is imported, so it works whatever the CLI wires.
"""

import multiprocessing
import sys


def main() -> int:
    multiprocessing.freeze_support()
    if "--self-test" in sys.argv[1:]:
        from app.selftest import run_self_test

        return run_self_test()
    from app.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
