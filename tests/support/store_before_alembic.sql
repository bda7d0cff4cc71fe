BEGIN TRANSACTION;
CREATE TABLE gpupool_allocations (
	id INTEGER NOT NULL,
	kind VARCHAR(16) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(255) NOT NULL,
	node VARCHAR(255) NOT NULL,
	gpus JSON NOT NULL,
	gpu_milli INTEGER NOT NULL,
	cpu_milli INTEGER NOT NULL,
	memory_mib INTEGER NOT NULL,
	groups JSON NOT NULL,
	state VARCHAR(16) NOT NULL,
	pid INTEGER,
	created DATETIME NOT NULL,
	updated DATETIME NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT one_allocation_per_workload UNIQUE (kind, owner, name)
);
INSERT INTO "gpupool_allocations" VALUES(1,'build','ann','','node-a','[0]',250,2000,8192,'["students"]','running',4242,'2026-11-26 12:00:00.000000','2026-11-26 12:00:00.000000');
INSERT INTO "gpupool_allocations" VALUES(2,'train','bob','j-000001','node-a','[1, 2]',1000,0,0,'[]','reserved',NULL,'2026-11-26 12:00:00.000000','2026-11-26 12:00:00.000000');
CREATE TABLE gpupool_budget_grants (
	id INTEGER NOT NULL,
	target VARCHAR(300) NOT NULL,
	kind VARCHAR(16) NOT NULL,
	milli_s BIGINT NOT NULL,
	until INTEGER NOT NULL,
	"by" VARCHAR(255) NOT NULL,
	note TEXT NOT NULL,
	created DATETIME NOT NULL,
	PRIMARY KEY (id)
);
INSERT INTO "gpupool_budget_grants" VALUES(1,'group:students','topup',3600000,1796000000,'admin','exam week','2026-11-26 12:00:00.000000');
CREATE TABLE gpupool_elastic (
	job_id VARCHAR(32) NOT NULL,
	min_gpus INTEGER NOT NULL,
	max_gpus INTEGER NOT NULL,
	PRIMARY KEY (job_id)
);
INSERT INTO "gpupool_elastic" VALUES('j-000001',1,4);
CREATE TABLE gpupool_events (
	id INTEGER NOT NULL,
	time DATETIME NOT NULL,
	kind VARCHAR(32) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(255) NOT NULL,
	message TEXT NOT NULL,
	data JSON NOT NULL,
	PRIMARY KEY (id)
);
INSERT INTO "gpupool_events" VALUES(1,'2026-11-26 12:00:00.000000','reserve','ann','','ann got 0.25 GPU on node-a','{"gpus": [0]}');
CREATE TABLE gpupool_job_pools (
	job_id VARCHAR(32) NOT NULL,
	pools JSON NOT NULL,
	PRIMARY KEY (job_id)
);
INSERT INTO "gpupool_job_pools" VALUES('j-000001','["dgx", "ws"]');
CREATE TABLE gpupool_jobs (
	id VARCHAR(32) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	project VARCHAR(255) NOT NULL,
	name VARCHAR(64) NOT NULL,
	num_gpu INTEGER NOT NULL,
	gpu_milli INTEGER NOT NULL,
	priority INTEGER NOT NULL,
	command JSON NOT NULL,
	workdir TEXT NOT NULL,
	state VARCHAR(16) NOT NULL,
	submitted FLOAT NOT NULL,
	started FLOAT,
	finished FLOAT,
	min_runtime_s FLOAT NOT NULL,
	max_runtime_s FLOAT NOT NULL,
	preemptions INTEGER NOT NULL,
	runs INTEGER NOT NULL,
	pid INTEGER,
	exit_code INTEGER,
	message TEXT NOT NULL,
	intent VARCHAR(16) NOT NULL,
	term_sent FLOAT,
	created DATETIME NOT NULL,
	PRIMARY KEY (id)
);
INSERT INTO "gpupool_jobs" VALUES('j-000001','bob','vision','resnet',2,1000,1,'["python", "train.py", "--epochs", "3"]','/home/bob/run','running',1795000000.0,1795000100.0,NULL,0.0,0.0,0,1,NULL,NULL,'','',NULL,'2026-11-26 12:00:00.000000');
INSERT INTO "gpupool_jobs" VALUES('j-000002','bob','vision','sweep-1',1,500,0,'["python", "sweep.py"]','/home/bob/sweep','queued',1795000200.0,NULL,NULL,0.0,0.0,0,0,NULL,NULL,'','',NULL,'2026-11-26 12:00:00.000000');
CREATE TABLE gpupool_moves (
	id INTEGER NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(255) NOT NULL,
	from_node VARCHAR(255) NOT NULL,
	from_gpus JSON NOT NULL,
	from_uuids JSON NOT NULL,
	to_node VARCHAR(255) NOT NULL,
	to_gpus JSON NOT NULL,
	to_uuids JSON NOT NULL,
	gpu_milli INTEGER NOT NULL,
	why VARCHAR(255) NOT NULL,
	phase VARCHAR(16) NOT NULL,
	pids JSON NOT NULL,
	server_pid INTEGER,
	started_at FLOAT NOT NULL,
	ended_at FLOAT,
	reason TEXT NOT NULL,
	created DATETIME NOT NULL,
	PRIMARY KEY (id)
);
INSERT INTO "gpupool_moves" VALUES(1,'dan','','node-a','[0]','["GPU-0"]','node-b','[1]','["GPU-1"]',250,'a training job','moved','[88]',NULL,1795000400.0,1795000410.0,'','2026-11-26 12:00:00.000000');
CREATE TABLE gpupool_parked (
	id INTEGER NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(255) NOT NULL,
	node VARCHAR(255) NOT NULL,
	gpus JSON NOT NULL,
	gpu_uuids JSON NOT NULL,
	gpu_milli INTEGER NOT NULL,
	model VARCHAR(255) NOT NULL,
	groups JSON NOT NULL,
	pids JSON NOT NULL,
	server_pid INTEGER,
	parked_at FLOAT NOT NULL,
	claimed_at FLOAT,
	created DATETIME NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT one_parking_per_workspace UNIQUE (owner, name)
);
INSERT INTO "gpupool_parked" VALUES(1,'cara','big','node-b','[3]','["GPU-3"]',500,'H200','["lab"]','[777]',770,1795000300.0,NULL,'2026-11-26 12:00:00.000000');
CREATE TABLE gpupool_settings (
	"key" VARCHAR(64) NOT NULL,
	value JSON NOT NULL,
	updated DATETIME NOT NULL,
	PRIMARY KEY ("key")
);
INSERT INTO "gpupool_settings" VALUES('quotas','{"default_build_quota": 1.0, "group_overrides": {"lab": {"quota": 2}}}','2026-11-26 12:27:35.914042');
CREATE TABLE gpupool_sweep_runs (
	job_id VARCHAR(32) NOT NULL,
	sweep_id VARCHAR(32) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	parameters JSON NOT NULL,
	PRIMARY KEY (job_id)
);
INSERT INTO "gpupool_sweep_runs" VALUES('j-000002','s-01','bob','{"lr": 0.01}');
CREATE TABLE gpupool_usage_hours (
	hour INTEGER NOT NULL,
	kind VARCHAR(16) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(255) NOT NULL,
	since INTEGER NOT NULL,
	milli INTEGER NOT NULL,
	measured_milli_s BIGINT NOT NULL,
	used_milli_s BIGINT NOT NULL,
	peak_memory_mib INTEGER NOT NULL,
	share_memory_mib INTEGER NOT NULL,
	samples INTEGER NOT NULL,
	PRIMARY KEY (hour, kind, owner, name, since)
);
INSERT INTO "gpupool_usage_hours" VALUES(498611,'build','ann','',1795000000,250,900000,450000,4000,35840,120);
CREATE INDEX ix_gpupool_allocations_owner ON gpupool_allocations (owner);
CREATE INDEX ix_gpupool_events_kind ON gpupool_events (kind);
CREATE INDEX ix_gpupool_events_time ON gpupool_events (time);
CREATE INDEX ix_gpupool_events_owner ON gpupool_events (owner);
CREATE INDEX ix_gpupool_jobs_owner ON gpupool_jobs (owner);
CREATE INDEX ix_gpupool_jobs_state ON gpupool_jobs (state);
CREATE INDEX ix_gpupool_moves_owner ON gpupool_moves (owner);
CREATE INDEX ix_gpupool_parked_owner ON gpupool_parked (owner);
CREATE INDEX ix_gpupool_sweep_runs_sweep_id ON gpupool_sweep_runs (sweep_id);
CREATE INDEX ix_gpupool_budget_grants_target ON gpupool_budget_grants (target);
COMMIT;
