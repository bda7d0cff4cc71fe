# The stand-in for KAI-Scheduler's GPU reservation pod image (resource-reservation:v0.12.0, whose
# program cmd/resourcereservation cannot work here: it asks NVML, through the driver's library,
# which GPU the device plugin gave the pod). reservation.py does what that program does, reading
# the device from NVIDIA_VISIBLE_DEVICES instead, which the node's device plugin set.
FROM python:3.12-slim-bookworm
COPY reservation.py /reservation.py
USER 65534
ENTRYPOINT ["python3", "/reservation.py"]
