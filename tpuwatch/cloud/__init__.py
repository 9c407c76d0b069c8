"""The cloud's maintenance notices for this VM: Compute Engine's metadata server and EC2's IMDSv2.

``events`` parses the answers (pure), ``http`` makes one bounded request, ``gce`` and ``ec2`` keep the notices
current in their own threads, ``collector`` is the source the registry builds, ``standin`` a metadata server
for the drill and the tests.
"""
