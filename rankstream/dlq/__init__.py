"""`rankstream dlq`: the dead letters the workers wrote (worker/dlq.py), for people.

stats   counts by reason and by hour                           report.py
show    each dead letter: place, bytes, decoded event, headers report.py
replay  produce fixed dead letters to update_rank again, once  replay.py, plan.py, ledger.py, fix.py

Every part reads the dead-letter topic the same way (reader.py: read_committed, from the
beginning to the end each partition had when the command started, through clients.py) and sees
each record as a DeadLetter (records.py); command.py checks the arguments and runs the action.
docs/operations/dead-letters.md is the user's page.
"""
