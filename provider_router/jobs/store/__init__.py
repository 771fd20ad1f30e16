"""The job directory on disk: the journal, the outputs, the job's ledger and recovery."""
