"""Schedules: recurring jobs an organization defines (a cron expression or an interval, a job
body, an overlap policy), recorded as receipts on `schedules/<id>` and fired by Temporal
Schedules that worker-control keeps in line with them."""
