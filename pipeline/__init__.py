"""Library entry points shared by the command line, the batch runner and the live server (DESIGN 5e):
main_job.py (the main job, one function), run_args.py (its options), live/ (the live session server)."""
