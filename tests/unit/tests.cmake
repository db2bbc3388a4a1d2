# Unit tier: no sockets, no sleeps; time comes from shoal::FakeClock.
shoal_test(round_engine_test unit ${CMAKE_CURRENT_LIST_DIR}/round_engine_test.cc
  LIBS coordinator_core)
shoal_test(shard_plan_test unit ${CMAKE_CURRENT_LIST_DIR}/shard_plan_test.cc
  LIBS coordinator_core)
shoal_test(chunk_codec_test unit ${CMAKE_CURRENT_LIST_DIR}/chunk_codec_test.cc
  LIBS shoal_common)
shoal_test(idx_reader_test unit ${CMAKE_CURRENT_LIST_DIR}/idx_reader_test.cc
  LIBS worker_core ZLIB::ZLIB)
shoal_test(model_state_test unit ${CMAKE_CURRENT_LIST_DIR}/model_state_test.cc
  LIBS worker_core)
shoal_test(serving_rule_test unit ${CMAKE_CURRENT_LIST_DIR}/serving_rule_test.cc
  LIBS worker_core)
shoal_test(tensor_wire_test unit ${CMAKE_CURRENT_LIST_DIR}/tensor_wire_test.cc
  LIBS shoal_common)
shoal_test(push_box_test unit ${CMAKE_CURRENT_LIST_DIR}/push_box_test.cc LIBS worker_core)
shoal_test(plan_list_test unit ${CMAKE_CURRENT_LIST_DIR}/plan_list_test.cc
  LIBS worker_core)
shoal_test(exchanger_test unit ${CMAKE_CURRENT_LIST_DIR}/exchanger_test.cc
  LIBS worker_lib)
shoal_test(malloc_tuning_test unit ${CMAKE_CURRENT_LIST_DIR}/malloc_tuning_test.cc
  LIBS worker_lib)
shoal_test(store_malloc_test unit ${CMAKE_CURRENT_LIST_DIR}/store_malloc_test.cc
  LIBS checkpoint_malloc)
# Links LibTorch through worker_trainer (the test itself includes no Torch header).
shoal_test(trainer_test unit ${CMAKE_CURRENT_LIST_DIR}/trainer_test.cc
  LIBS worker_trainer)
shoal_test(status_format_test unit ${CMAKE_CURRENT_LIST_DIR}/status_format_test.cc
  LIBS shoalctl_lib)
shoal_test(shoalctl_cli_test unit ${CMAKE_CURRENT_LIST_DIR}/shoalctl_cli_test.cc
  LIBS shoalctl_lib)
shoal_test(diagnose_test unit ${CMAKE_CURRENT_LIST_DIR}/diagnose_test.cc LIBS shoalctl_lib)
shoal_test(round_engine_membership_test unit
  ${CMAKE_CURRENT_LIST_DIR}/round_engine_membership_test.cc LIBS coordinator_core)
shoal_test(run_record_test unit ${CMAKE_CURRENT_LIST_DIR}/run_record_test.cc
  LIBS coordinator_core)
shoal_test(layer_planner_test unit ${CMAKE_CURRENT_LIST_DIR}/layer_planner_test.cc
  LIBS worker_core)
shoal_test(model_syncer_test unit ${CMAKE_CURRENT_LIST_DIR}/model_syncer_test.cc
  LIBS worker_lib)
shoal_test(retry_test unit ${CMAKE_CURRENT_LIST_DIR}/retry_test.cc LIBS shoal_common)
shoal_test(parallel_chunks_test unit ${CMAKE_CURRENT_LIST_DIR}/parallel_chunks_test.cc LIBS shoal_common)
shoal_test(round_decisions_test unit ${CMAKE_CURRENT_LIST_DIR}/round_decisions_test.cc
  LIBS coordinator_core)
shoal_test(worker_protocol_test unit ${CMAKE_CURRENT_LIST_DIR}/worker_protocol_test.cc
  LIBS worker_core)
shoal_test(model_memory_test unit ${CMAKE_CURRENT_LIST_DIR}/model_memory_test.cc
  LIBS worker_core)
shoal_test(reduce_window_test unit ${CMAKE_CURRENT_LIST_DIR}/reduce_window_test.cc
  LIBS worker_core)
shoal_test(fuzz_corpus_test unit ${CMAKE_CURRENT_LIST_DIR}/fuzz_corpus_test.cc
  ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_targets.cc
  LIBS checkpoint_core coordinator_core worker_core shoalctl_lib)
target_compile_definitions(fuzz_corpus_test PRIVATE
  SHOAL_FUZZ_CORPUS_DIR="${PROJECT_SOURCE_DIR}/tests/fuzz/corpus")
shoal_test(metrics_test unit ${CMAKE_CURRENT_LIST_DIR}/metrics_test.cc LIBS shoal_common)
# The HTTP endpoint of /metrics and the web page (cpp-httplib).
shoal_test(http_endpoint_test unit ${CMAKE_CURRENT_LIST_DIR}/http_endpoint_test.cc LIBS shoal_common)
shoal_test(codec_test unit ${CMAKE_CURRENT_LIST_DIR}/codec_test.cc LIBS worker_core)
# The owners' aggregation rules: mean, trimmed mean, median (issue 14).
shoal_test(aggregation_test unit ${CMAKE_CURRENT_LIST_DIR}/aggregation_test.cc LIBS worker_core)
shoal_test(outer_optimizer_test unit ${CMAKE_CURRENT_LIST_DIR}/outer_optimizer_test.cc
  LIBS worker_core)
shoal_test(encoded_store_test unit ${CMAKE_CURRENT_LIST_DIR}/encoded_store_test.cc
  LIBS worker_core)
shoal_test(encoded_exchange_test unit ${CMAKE_CURRENT_LIST_DIR}/encoded_exchange_test.cc
  LIBS worker_lib)
shoal_test(model_file_test unit ${CMAKE_CURRENT_LIST_DIR}/model_file_test.cc LIBS shoal_common)
shoal_test(progress_test unit ${CMAKE_CURRENT_LIST_DIR}/progress_test.cc LIBS shoal_common)
shoal_test(dataset_test unit ${CMAKE_CURRENT_LIST_DIR}/dataset_test.cc LIBS worker_core ZLIB::ZLIB)
shoal_test(data_split_test unit ${CMAKE_CURRENT_LIST_DIR}/data_split_test.cc LIBS worker_core)
# Gossip mode's pure parts (worker and coordinator side).
shoal_test(gossip_policy_test unit ${CMAKE_CURRENT_LIST_DIR}/gossip_policy_test.cc
  LIBS worker_core coordinator_core)
shoal_test(round_engine_gossip_test unit ${CMAKE_CURRENT_LIST_DIR}/round_engine_gossip_test.cc
  LIBS coordinator_core)
# The worker's gossip protocol (events in, actions out) and where the
# session's messages go.
shoal_test(gossip_protocol_test unit ${CMAKE_CURRENT_LIST_DIR}/gossip_protocol_test.cc
  LIBS worker_core)
shoal_test(directive_route_test unit ${CMAKE_CURRENT_LIST_DIR}/directive_route_test.cc
  LIBS worker_core)
shoal_test(replica_test unit ${CMAKE_CURRENT_LIST_DIR}/replica_test.cc
  LIBS coordinator_core shoal_etcd)
shoal_test(auth_test unit ${CMAKE_CURRENT_LIST_DIR}/auth_test.cc LIBS shoal_common)
shoal_test(zone_test unit ${CMAKE_CURRENT_LIST_DIR}/zone_test.cc LIBS shoal_common)
shoal_test(join_limiter_test unit ${CMAKE_CURRENT_LIST_DIR}/join_limiter_test.cc LIBS coordinator_core)
shoal_test(admission_test unit ${CMAKE_CURRENT_LIST_DIR}/admission_test.cc LIBS coordinator_service)
shoal_test(zone_election_test unit ${CMAKE_CURRENT_LIST_DIR}/zone_election_test.cc
  LIBS coordinator_core)
shoal_test(slice_sizing_test unit ${CMAKE_CURRENT_LIST_DIR}/slice_sizing_test.cc
  LIBS coordinator_core)
shoal_test(relay_assignment_test unit ${CMAKE_CURRENT_LIST_DIR}/relay_assignment_test.cc
  LIBS coordinator_core)
shoal_test(final_average_test unit ${CMAKE_CURRENT_LIST_DIR}/final_average_test.cc
  LIBS coordinator_core)
shoal_test(zone_measurements_test unit ${CMAKE_CURRENT_LIST_DIR}/zone_measurements_test.cc
  LIBS worker_core)
shoal_test(hierarchy_plan_test unit ${CMAKE_CURRENT_LIST_DIR}/hierarchy_plan_test.cc
  LIBS coordinator_core)
# The averaging pipeline's hierarchical rounds (exchanger.h): fp32 models,
# int8 + nesterov changes, a robust rule across zones, carried stages.
shoal_test(hierarchical_exchange_test unit ${CMAKE_CURRENT_LIST_DIR}/hierarchical_exchange_test.cc
  LIBS worker_lib)
# Which steps a plan asks of a worker (core/averaging_steps.h): pure.
shoal_test(averaging_steps_test unit ${CMAKE_CURRENT_LIST_DIR}/averaging_steps_test.cc
  LIBS worker_core)
shoal_test(member_credentials_test unit ${CMAKE_CURRENT_LIST_DIR}/member_credentials_test.cc
  LIBS coordinator_core)
# The relay's RelayDown assembly (directive bytes serialized once, grouped
# by message, each member's order kept): bytes in, bytes out, no sockets.
shoal_test(stream_wire_test unit ${CMAKE_CURRENT_LIST_DIR}/stream_wire_test.cc
  LIBS coordinator_service)
shoal_test(run_config_test unit ${CMAKE_CURRENT_LIST_DIR}/run_config_test.cc
  LIBS shoal_run_config_file coordinator_core)
# The settings' one source (RunConfig's `setting` options): the generated
# flags (linked here as in shoal-coordinator), their merge, the file form
# and docs/CONFIG.md's generated tables.
shoal_test(run_config_settings_test unit ${CMAKE_CURRENT_LIST_DIR}/run_config_settings_test.cc
  LIBS coordinator_run_config_flags shoal_run_config_flags)
target_compile_definitions(run_config_settings_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# The coordinator engine's parts on their own (round_engine.h is their
# facade): each is called as RoundEngine calls it, without its lock.
shoal_test(membership_test unit ${CMAKE_CURRENT_LIST_DIR}/membership_test.cc LIBS coordinator_core)
shoal_test(topology_test unit ${CMAKE_CURRENT_LIST_DIR}/topology_test.cc LIBS coordinator_core)
shoal_test(checkpoint_planner_test unit ${CMAKE_CURRENT_LIST_DIR}/checkpoint_planner_test.cc
  LIBS coordinator_core)
shoal_test(sync_rounds_test unit ${CMAKE_CURRENT_LIST_DIR}/sync_rounds_test.cc LIBS coordinator_core)
shoal_test(base_recovery_test unit ${CMAKE_CURRENT_LIST_DIR}/base_recovery_test.cc LIBS coordinator_core)
shoal_test(round_trust_test unit ${CMAKE_CURRENT_LIST_DIR}/round_trust_test.cc LIBS coordinator_core)
shoal_test(sample_ledger_test unit ${CMAKE_CURRENT_LIST_DIR}/sample_ledger_test.cc
  LIBS coordinator_core worker_core)
# Not gossip_peers_test: that is the workers' PeerService (integration).
shoal_test(coordinator_gossip_peers_test unit
  ${CMAKE_CURRENT_LIST_DIR}/coordinator_gossip_peers_test.cc LIBS coordinator_core)
# The model layout rule and the external trainer (docs/PYTHON.md).
shoal_test(model_layout_test unit ${CMAKE_CURRENT_LIST_DIR}/model_layout_test.cc
  LIBS coordinator_core worker_core)
# The Python loop's turns: what it pulls and pushes, and when (issue 47).
shoal_test(external_trainer_test unit ${CMAKE_CURRENT_LIST_DIR}/external_trainer_test.cc
  LIBS worker_core)
# Overlapped rounds: which round's progress applies to which model, and the
# carry (issue 27).
shoal_test(local_training_test unit ${CMAKE_CURRENT_LIST_DIR}/local_training_test.cc
  LIBS worker_lib)
# What strangers send: the character rule and the coordinator's limits
# (issue 50); reads docs/SECURITY.md's table of limits.
shoal_test(request_limits_test unit ${CMAKE_CURRENT_LIST_DIR}/request_limits_test.cc
  LIBS coordinator_core)
target_compile_definitions(request_limits_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# shoalctl prints nothing that acts on a terminal, in every form (issue 50).
shoal_test(terminal_text_test unit ${CMAKE_CURRENT_LIST_DIR}/terminal_text_test.cc
  LIBS shoalctl_lib shoalctl_checkpoints yaml-cpp)
