"""Vertex AI's training job model (aiplatform v1: customJobs, hyperparameterTuningJobs,
trainingPipelines) beside AI Platform's, over the same store, controller, planner and backends.

Its REST resources (resources.py), the executor images (images.py), the translation of a job
into the ml v1 job the controller runs plus the replica contract Vertex gives its replicas
(translate.py), and the records that keep Vertex's names and numeric IDs (records.py) live
here; the runtime core knows none of Vertex's names.
"""
