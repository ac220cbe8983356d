"""The exit codes of every sub-command: one set, the README's "Exit codes" table.

``run`` ends with its COMMAND's own code once COMMAND has started.
"""

from __future__ import annotations

#: The command did its work and the answer is not a failure (``check``: the settings can work;
#: ``report``: the verdict is pass or incomparable; ``drift``, ``probe``, ``examples``: done).
EXIT_OK = 0
#: The answer is a failure: ``check``: a rule is violated; ``report``: the run's verdict is fail.
EXIT_FAILED = 1
#: The input cannot be used (missing, malformed, over a limit, an unknown name) or the output
#: cannot be written; one line on stderr says which and the fix. argparse's usage errors are 2 too.
EXIT_UNUSABLE = 2
#: A failure inside nemo-rl-attn-align itself (a bug), never a verdict on the input: one line on
#: stderr naming the command, the exception and where to report it.
EXIT_INTERNAL_ERROR = 3

#: Where an internal error is reported.
ISSUES_URL = "https://github.com/nemo-rl-attn-align/nemo-rl-attn-align/issues"
