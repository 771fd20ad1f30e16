"""OpenRouter's Batch API as a job's route: submit, poll, collect, within the budget."""
