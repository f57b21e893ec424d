"""What a failed docker command's node result says: Docker's own error, not the help pointer it prints
after it (seen on the lab's real dockerd: a rank's launch reported only "See 'docker run --help'.")."""

from __future__ import annotations

from sparkfleet.fleet.ops.base import classify
from sparkfleet.fleet.transport import Result, telling_line

CONFLICT = ('docker: Error response from daemon: Conflict. The container name "/sf-dcp2-r1" is already in use by '
            'container "4f1c". You have to remove (or rename) that container to be able to reuse that name.\n'
            "See 'docker run --help'.\n")
ULIMIT = ('invalid argument "memlock=lots" for "--ulimit" flag: strconv.ParseInt: parsing "lots": invalid syntax\n'
          "See 'docker run --help'.\n")


def test_the_telling_line_skips_dockers_help_pointer():
    assert telling_line(CONFLICT).startswith("docker: Error response from daemon: Conflict.")
    assert telling_line(ULIMIT).startswith('invalid argument "memlock=lots"')
    assert telling_line("", "only stdout\n") == "only stdout"
    assert telling_line("See 'docker run --help'.\n") == "See 'docker run --help'."  # nothing else said
    assert telling_line("", "") is None


def test_a_refused_run_is_classified_with_dockers_words():
    err = classify(Result("asusi", False, "", CONFLICT, exit_code=125, error="exit"))
    assert err is not None and err.kind == "failed"
    assert err.message.startswith('exit 125: docker: Error response from daemon: Conflict. The container name '
                                  '"/sf-dcp2-r1" is already in use')
