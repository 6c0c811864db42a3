"""The job runtime: one controller process per aiptrain home drives every job.

control     the light side any command uses: start the controller if absent, wake it, ask it to stop
controller  the long-lived loop: adopts active jobs, steps their drivers, watches the engines
events      the controller's chores as periodic events (adoption, pruning and sweep, command server, idle exit)
driver      JobDriver.step(): observe -> lifecycle.decide -> restart | tear down | record
groups      replica groups: what the driver and the study share
study       a tuning job's trials, driven as groups by the same driver
logcopy     replicas' output -> the job's JSON-lines log
"""
