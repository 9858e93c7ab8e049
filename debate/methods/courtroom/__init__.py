"""PROClaim's courtroom as a package, one module a stage; trial.run_batch runs them in order (see trial.py)."""
