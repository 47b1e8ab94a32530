"""What the demo's report modules share: one aligned line, one psql query."""
import os
import subprocess

# The report's labels end at one column, whatever they say.
LABEL_WIDTH = 23


def say(label, text):
    """One line of the report: its label, then the text, aligned."""
    print("%-*s%s" % (LABEL_WIDTH, label + ":", text))


def psql(sql, url=None):
    out = subprocess.run(["psql", "-X", "-q", "-tA", url or os.environ["DATABASE_URL"], "-c",
                          sql], check=True, capture_output=True).stdout.decode()
    return [l.split("|") for l in out.strip().splitlines() if l]
