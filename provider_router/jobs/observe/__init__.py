"""What an operator sees of a job: live lines, snapshots, timeline, status and report."""
