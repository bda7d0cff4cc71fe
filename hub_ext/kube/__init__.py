"""Train jobs on Kubernetes: a batch/v1 Job per promoted train job, followed by a watch.

`job_spec.TrainJobSpec` is what a job needs; `objects` builds the Job and its checkpoint
claim as pure functions; `status` maps a Job and its pods to gpupool's job states;
`controller.KubeJobController` creates Jobs through kubernetes_asyncio and watches them;
`kueue` renders the optional Kueue queues.
"""

from gpupool.kube.job_spec import TrainJobSpec

__all__ = ["TrainJobSpec"]
