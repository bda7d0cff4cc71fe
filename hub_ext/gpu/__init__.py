"""What workspaces, train jobs and the hub share about a GPU share: the environment a process gets
(`env`) and how a share is expressed to a GPU-sharing mechanism (`sharing`). Imported downward by
gpupool.spawner, gpupool.kube and the hub set-up."""
