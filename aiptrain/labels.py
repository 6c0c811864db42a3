"""The engine labels aiptrain puts on what it makes (containers, networks, services), in one
place: the planner writes them, the storage endpoint and the backends read them back."""

LABEL_PREFIX = "aiptrain."
LABEL_JOB = LABEL_PREFIX + "job-id"
LABEL_TASK = LABEL_PREFIX + "task-name"
LABEL_TASK_TYPE = LABEL_PREFIX + "task-type"
LABEL_TASK_INDEX = LABEL_PREFIX + "task-index"
LABEL_INSTALLATION = LABEL_PREFIX + "installation"
LABEL_TRIAL = LABEL_PREFIX + "trial-id"
LABEL_INSTALL_FOR = LABEL_PREFIX + "install-for"  # the job whose packages an install container installs
LABEL_ROLE = LABEL_PREFIX + "role"  # what an installation-wide container or network is for
LABEL_CODE = LABEL_PREFIX + "endpoint-code"  # the server code's digest: a changed aiptrain replaces the endpoint
LABEL_HOME = LABEL_PREFIX + "home"  # on every container and network made here: the home it belongs to
