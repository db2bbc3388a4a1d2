# End-to-end: the real binaries as processes on loopback.
shoal_test(cluster_test e2e e2e/cluster_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(cluster_test shoal-coordinator shoal-worker shoalctl)
shoal_test(faults_test e2e e2e/faults_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(faults_test shoal-coordinator shoal-worker)

# The chaos scenario: not part of `make test` (it runs for minutes); `make chaos`.
add_executable(shoal-chaos e2e/chaos.cc)
target_link_libraries(shoal-chaos PRIVATE test_support shoal_protos shoal_common absl::flags
  absl::flags_parse)
add_dependencies(shoal-chaos shoal-coordinator shoal-worker)
shoal_test(shutdown_test e2e e2e/shutdown_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(shutdown_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
shoal_test(shoalctl_e2e_test e2e e2e/shoalctl_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(shoalctl_e2e_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
shoal_test(checkpoint_run_test e2e e2e/checkpoint_run_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(checkpoint_run_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
# --help of every binary lists its own flags (quick; no cluster).
shoal_test(help_test e2e e2e/help_test.cc)
add_dependencies(help_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
shoal_test(straggler_test e2e e2e/straggler_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(straggler_test shoal-coordinator shoal-worker)
# A real Prometheus scrapes every server of a run (issue 15).
shoal_test(prometheus_test e2e e2e/prometheus_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(prometheus_test shoal-coordinator shoal-worker shoal-checkpoint)
target_compile_definitions(prometheus_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# The coordinator's web page in headless Chromium (issue 15); keeps a
# screenshot in build/artifacts/web_page_test/ (or $SHOAL_ARTIFACT_DIR).
shoal_test(web_page_test e2e e2e/web_page_test.cc LIBS shoal_protos shoal_common SERIAL)
target_compile_definitions(web_page_test PRIVATE
  SHOAL_DEFAULT_ARTIFACT_DIR="${CMAKE_BINARY_DIR}/artifacts")
add_dependencies(web_page_test shoal-coordinator shoal-worker)
# A run over mutual TLS, and a worker of another CA that cannot join (issue 14).
shoal_test(tls_e2e_test e2e e2e/tls_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
target_compile_definitions(tls_e2e_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(tls_e2e_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
# Compressed exchanges and the outer optimizer (issue 16).
shoal_test(compress_test e2e e2e/compress_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(compress_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
# The example TorchScript CNN trained by 3 workers; export loaded in Python (issue 15).
shoal_test(torchscript_run_test e2e e2e/torchscript_run_test.cc LIBS shoal_protos shoal_common
  SERIAL)
target_compile_definitions(torchscript_run_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(torchscript_run_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)
# Gossip mode (issue 11): 4 workers to 0.85 without rounds; kill -9 and a late joiner.
shoal_test(gossip_test e2e e2e/gossip_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(gossip_test shoal-coordinator shoal-worker shoalctl)
# Gossip checkpoints (issue 11): uploads, the checkpointer killed, export, resume, final upload.
shoal_test(gossip_checkpoint_test e2e e2e/gossip_checkpoint_test.cc LIBS shoal_protos shoal_common
  SERIAL)
add_dependencies(gossip_checkpoint_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)

# Coordinator replicas on real etcd members (issue 13).
shoal_test(replica_e2e_test e2e e2e/replica_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(replica_e2e_test shoal-coordinator shoal-worker)
# bench/run.sh wan's network alone (issue 16): namespaces, bridge, veth pairs
# shaped with tc tbf, a TCP connection from every worker namespace, teardown,
# nothing left behind. No timing. Skipped (77) when not root or without ip/tc.
add_test(NAME WanNetworkSmoke
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/bench/wan/wan.py --check_net --skip_code=77)
set_tests_properties(WanNetworkSmoke PROPERTIES LABELS e2e TIMEOUT 120 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
# Bandwidth-proportional slices over a shaped link (issue 49): bench/hetero's
# network, worker 1 at 10 Mbit/s each way, the others unshaped, a 4 MiB
# model, 5 rounds with --slice_sizing=bandwidth: worker 1's slice share ends
# below half of an even one and every round's hashes agree. Needs root, ip,
# tc and python3-torch (for the model file); skipped (77) without root.
add_test(NAME SliceSizingNetns
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/bench/hetero/hetero.py
    --bin=${CMAKE_BINARY_DIR}/bin --out=${CMAKE_BINARY_DIR}/artifacts/slice_sizing_netns
    --arms=bandwidth --fast_mbit=0 --hidden=1319 --rounds=5 --measured=2 --poll=2
    --cap_seconds=600 --expect_shrink --skip_code=77)
set_tests_properties(SliceSizingNetns PROPERTIES LABELS e2e TIMEOUT 900 SKIP_RETURN_CODE 77
  RUN_SERIAL TRUE)
shoal_test(token_e2e_test e2e e2e/token_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(token_e2e_test shoal-coordinator shoal-worker shoal-checkpoint shoalctl)

# Robust aggregation at slice owners against a poisoning peer (issue 14):
# shoal-poison-worker is a real worker whose contributions are scaled by
# --scale (WorkerOptions::contribution_transform); a test-only binary, not a
# flag of shoal-worker.
add_executable(shoal-poison-worker ${PROJECT_SOURCE_DIR}/tests/support/poison_worker.cc)
target_link_libraries(shoal-poison-worker PRIVATE worker_lib absl::flags absl::flags_parse
  absl::flags_usage)
shoal_warnings(shoal-poison-worker)
shoal_test(robust_test e2e e2e/robust_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(robust_test shoal-coordinator shoal-worker shoal-poison-worker shoalctl)

# Supernodes over a real slow link (issue 12): two sites in network
# namespaces (tests/support/two_sites.sh) joined by a 20 Mbit/s tc tbf link.
# Skipped with a message where namespaces cannot be created.
shoal_test(supernode_netns_test e2e e2e/supernode_netns_test.cc LIBS shoal_protos shoal_common
  SERIAL)
target_compile_definitions(supernode_netns_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(supernode_netns_test shoal-coordinator shoal-worker shoalctl)
# Zones (issue 12): the zone tree, elected supernodes and a standby's takeover.
shoal_test(zones_test e2e e2e/zones_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(zones_test shoal-coordinator shoal-worker shoalctl)
# The hierarchical round over two zones, one zone, refused flags (issue 12).
shoal_test(hierarchy_test e2e e2e/hierarchy_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(hierarchy_test shoal-coordinator shoal-worker)
# The control-plane relay's worker side (issue 12 item 5): members through
# their supernode, a supernode killed.
shoal_test(relay_e2e_test e2e e2e/relay_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(relay_e2e_test shoal-coordinator shoal-worker)
shoal_test(member_e2e_test e2e e2e/member_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(member_e2e_test shoal-coordinator shoal-worker)
# The run config file (issue 25, docs/CONFIG.md): --config, flags over it,
# --check_config, GetRunStatus's effective config, shoalctl config.
shoal_test(config_e2e_test e2e e2e/config_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(config_e2e_test shoal-coordinator shoal-worker shoalctl)
# The sample ledger under churn (issue 28).
shoal_test(ledger_test e2e e2e/ledger_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(ledger_test shoal-coordinator shoal-worker)
# Audits by replay, scores and bans (issue 28): honest runs, and a worker
# trained on shuffled labels caught, banned and refused.
shoal_test(audit_test e2e e2e/audit_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(audit_test shoal-coordinator shoal-worker shoalctl)
# Overlapped rounds: hashes agree, accuracy at equal samples, a kill during
# the exchange, a late joiner (issue 27).
# The accuracy case trains six runs of 5 x 400 steps: about 3 minutes on an
# idle machine, over 10 under a CPU hog on both cores (issue 30).
shoal_test(overlap_test e2e e2e/overlap_test.cc LIBS shoal_protos shoal_common SERIAL TIMEOUT 1800)
add_dependencies(overlap_test shoal-coordinator shoal-worker)
shoal_test(fragments_test e2e e2e/fragments_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(fragments_test shoal-coordinator shoal-worker)
# Bandwidth-proportional slices (issue 49): one paced uplink among unpaced
# ones on loopback; its slice shrinks, the hashes agree.
shoal_test(slice_sizing_e2e_test e2e e2e/slice_sizing_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(slice_sizing_e2e_test shoal-coordinator shoal-worker shoalctl)
# What strangers send is bounded (issue 50): refused joins, a flood of junk
# joins, odd names in shoalctl; and shoalctl against hostile answers.
shoal_test(limits_e2e_test e2e e2e/limits_e2e_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(limits_e2e_test shoal-coordinator shoal-worker shoalctl)
shoal_test(shoalctl_hostile_test e2e e2e/shoalctl_hostile_test.cc LIBS shoal_protos shoal_common
  SERIAL)
add_dependencies(shoalctl_hostile_test shoalctl)
