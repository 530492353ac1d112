"""Scheduling policies: where and when each ready task runs."""
