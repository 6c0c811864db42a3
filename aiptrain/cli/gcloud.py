"""gcloud's command line around aiptrain's: the prefixes people type before a command group
(`[beta|alpha] ai-platform|ml-engine`) and gcloud's global flags, which gcloud accepts at
any position before `--`. Both are taken out of argv before click sees it, so every
command and group (present or future) gets them without declaring them.

Functions over argv, with no click and no I/O but reading a --flags-file, so
`aiptrain --help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TRACKS = ("beta", "alpha")
SURFACES = ("ai-platform", "ml-engine")
MAX_FLAGS_FILES = 20
VERBOSITIES = ("debug", "info", "warning", "error", "critical", "none")

# gcloud-wide flags (googlecloudsdk/calliope/base.py and cli.py) that take a value.
VALUE_FLAGS = (
    "--project",
    "--format",
    "--verbosity",
    "--configuration",
    "--account",
    "--impersonate-service-account",
    "--billing-project",
    "--trace-token",
    "--access-token-file",
)
# ... and those that are switches (the --no- forms are gcloud's too).
SWITCHES = {
    "--quiet": ("quiet", True),
    "--no-quiet": ("quiet", False),
    "--log-http": ("log_http", True),
    "--no-log-http": ("log_http", False),
    "--user-output-enabled": ("user_output_enabled", True),
    "--no-user-output-enabled": ("user_output_enabled", False),
}
# Accepted, but nothing here talks to Google's APIs: said once at --verbosity info.
NO_LOCAL_EFFECT = {
    "--configuration": "aiptrain reads no gcloud configuration (`aiptrain gcloud-config` writes one)",
    "--account": "jobs run as the calling user, with no Google account",
    "--impersonate-service-account": "there are no Google credentials to impersonate",
    "--billing-project": "nothing is billed",
    "--trace-token": "there are no API calls to trace",
    "--access-token-file": "there are no API calls to authorize",
    "--log-http": "there is no HTTP traffic to log",
    "--user-output-enabled": "aiptrain's status lines are always written to stderr",
}


class GcloudUsageError(Exception):
    """A malformed gcloud-wide flag: one line, exit 2."""


@dataclass
class GlobalFlags:
    """gcloud-wide flags as given (None = not given); the last occurrence wins, as in gcloud."""

    project: str | None = None
    format: str | None = None
    verbosity: str = "warning"
    quiet: bool = False
    values: dict[str, str] = field(default_factory=dict)  # every value flag given, by name
    given: list[str] = field(default_factory=list)  # flag names in the order given

    def without_local_effect(self) -> list[str]:
        """`--flag: why` lines for the flags given that change nothing here."""
        seen = dict.fromkeys(name.replace("--no-", "--") for name in self.given)
        return [f"{name} has no local effect: {NO_LOCAL_EFFECT[name]}." for name in seen if name in NO_LOCAL_EFFECT]


def flags_file_tokens(path: str) -> list[str]:
    """gcloud's --flags-file: a YAML/JSON mapping of `--flag: value`, replaced by those flags
    (true: the switch; false: its --no- form; a list or map: gcloud's `a,b` / `k=v,...`)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as exc:
        raise GcloudUsageError(f"--flags-file [{path}] cannot be read: {exc.strerror}.") from None
    except yaml.YAMLError:
        raise GcloudUsageError(f"--flags-file [{path}] is not valid YAML: fix the syntax.") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and k.startswith("-") for k in data):
        raise GcloudUsageError(f"--flags-file [{path}] must be a mapping of `--flag: value` entries.")
    tokens: list[str] = []
    for name, value in data.items():
        if value is True:
            tokens.append(name)
        elif value is False:
            tokens.append("--no-" + name.lstrip("-"))
        elif isinstance(value, list):
            tokens += [name, ",".join(str(v) for v in value)]
        elif isinstance(value, dict):
            tokens += [name, ",".join(f"{k}={v}" for k, v in value.items())]
        elif value is not None:
            tokens += [name, str(value)]
    return tokens


def split_global_flags(argv: list[str]) -> tuple[list[str], GlobalFlags]:
    """argv without gcloud's global flags, and those flags. Everything from the first `--`
    on belongs to the trainer and is left alone."""
    flags = GlobalFlags()
    argv = list(argv)
    rest: list[str] = []
    flags_files = 0
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            rest += argv[index:]
            break
        name, has_value, value = token.partition("=")
        if name in VALUE_FLAGS or name == "--flags-file":
            if not has_value:
                if index + 1 >= len(argv) or argv[index + 1] == "--":
                    raise GcloudUsageError(f"argument {name}: expected one argument")
                index += 1
                value = argv[index]
            if name != "--flags-file":
                _set_value(flags, name, value)
            elif (flags_files := flags_files + 1) > MAX_FLAGS_FILES:
                raise GcloudUsageError(f"--flags-file [{value}]: more than {MAX_FLAGS_FILES} flags files; is one including itself?")
            else:
                argv[index + 1:index + 1] = flags_file_tokens(value)  # read next, in place
        elif name in SWITCHES:
            attribute, setting = SWITCHES[name]
            if has_value:  # `--log-http=false`, as older gcloud scripts write switches
                if value.lower() not in ("true", "false"):
                    raise GcloudUsageError(f"argument {name}: give true or false, not [{value}].")
                setting = setting == (value.lower() == "true")
            if attribute == "quiet":
                flags.quiet = setting
            flags.given.append(name)
        elif token == "-q":
            flags.quiet = True
            flags.given.append(token)
        else:
            rest.append(token)
        index += 1
    return rest, flags


def _set_value(flags: GlobalFlags, name: str, value: str) -> None:
    if name == "--verbosity" and value not in VERBOSITIES:
        choices = ", ".join(VERBOSITIES)
        raise GcloudUsageError(f"argument --verbosity: Invalid choice: '{value}'. Valid choices are [{choices}].")
    if name in ("--project", "--format") and not value.strip():
        raise GcloudUsageError(f"argument {name}: give a non-empty value.")
    flags.values[name] = value
    flags.given.append(name)
    if name == "--project":
        flags.project = value
    elif name == "--format":
        flags.format = value
    elif name == "--verbosity":
        flags.verbosity = value


def strip_prefix(argv: list[str]) -> list[str]:
    """`[beta|alpha] ai-platform|ml-engine GROUP ...` -> `GROUP ...`; other argv unchanged."""
    rest = argv[1:] if argv[:1] and argv[0] in TRACKS else argv
    if rest[:1] and rest[0] in SURFACES:
        return rest[1:]
    return argv


def is_gcloud_surface(argv: list[str]) -> bool:
    """Whether argv (global flags already taken out) is a command of `gcloud ai-platform`
    or `gcloud ml-engine`, the only ones aiptrain's gcloud shim forwards."""
    rest = argv[1:] if argv[:1] and argv[0] in TRACKS else argv
    return bool(rest) and rest[0] in SURFACES


def normalize(argv: list[str]) -> tuple[list[str], GlobalFlags]:
    """aiptrain's own argv for a gcloud-style one, and the gcloud-wide flags it held."""
    rest, flags = split_global_flags(argv)
    return strip_prefix(rest), flags
