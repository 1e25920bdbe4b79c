"""`digital-human batch`: many `run` jobs on Ray workers with warm engines, resumable.

jobs.py reads and checks the job file and names each job by a content key; worker.py is the Ray
actor (one per GPU or per few CPU cores) that runs jobs through the same code as `run`;
driver.py schedules jobs over the workers, retries those whose worker died and writes the summary.
Ray is an optional dependency (`pip install comfyui-digital-human[batch]`), imported only here.
"""
