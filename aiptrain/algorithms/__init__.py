"""AI Platform's built-in algorithms (linear learner, wide and deep, XGBoost, TabNet) as images
this machine builds offline from the runtime image and tags with the service's names, so that a
job naming `gcr.io/cloud-ml-algos/...` runs unchanged: catalog.py (names, labels: pure),
images.py (building them), trainer/ (what runs inside them)."""
