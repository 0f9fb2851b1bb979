"""The SeaweedFS behind every S3 case has room for every bucket a session makes."""

from tests.support.seaweed import SeaweedS3


def test_every_bucket_can_get_a_volume(seaweed: SeaweedS3) -> None:
    """Each bucket takes a volume of its own; a limit set from free disk space (62 on a
    67 GB disk) ran out part-way through a CI session with InternalError on every write."""
    assert seaweed.volume_limit() >= 4000
