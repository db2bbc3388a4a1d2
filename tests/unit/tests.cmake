# Unit tier: no sockets, no sleeps; time comes from shoal::FakeClock.
shoal_test(round_engine_test unit ${CMAKE_CURRENT_LIST_DIR}/round_engine_test.cc
  LIBS coordinator_core)
shoal_test(shard_planner_test unit ${CMAKE_CURRENT_LIST_DIR}/shard_planner_test.cc
  LIBS coordinator_core)
shoal_test(chunk_codec_test unit ${CMAKE_CURRENT_LIST_DIR}/chunk_codec_test.cc
  LIBS shoal_common)
