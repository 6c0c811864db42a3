"""The REST face of an installation: the `projects.jobs` methods of ml.googleapis.com v1 and
Cloud Logging's `entries.list` for job logs, so clients written for the service
(googleapiclient, Airflow's MLEngineHook, pipeline components) run unchanged.

    access.py   who may do what: the tokens file, authorisation, the IAM answers
    app.py      transport-free: a Request in, a Response out (routing, Google's error body);
                what a future controller hosts
    jobs.py     the ml v1 job methods over aiptrain.client.Client
    entries.py  Cloud Logging entries.list over the job logs (aiptrain.logs)
    server.py   the HTTP listener (stdlib ThreadingHTTPServer) around app.App
"""
