# Integration tier: real gRPC servers in-process on 127.0.0.1:0, real stubs,
# polling with deadlines (never fixed ports, never sleeps as synchronization).
shoal_test(coordinator_rpc_test integration ${CMAKE_CURRENT_LIST_DIR}/coordinator_rpc_test.cc
  LIBS coordinator_service worker_lib)
shoal_test(peer_exchange_test integration ${CMAKE_CURRENT_LIST_DIR}/peer_exchange_test.cc
  LIBS worker_lib)
# Counts operator new's live bytes (its own global new/delete): a binary of
# its own.
shoal_test(memory_budget_test integration ${CMAKE_CURRENT_LIST_DIR}/memory_budget_test.cc
  LIBS worker_lib)
shoal_test(reflection_test integration ${CMAKE_CURRENT_LIST_DIR}/reflection_test.cc
  LIBS coordinator_service)

# shoal-reflect-call: grpcurl's `list` and unary calls, through server
# reflection only. Deliberately not linked with shoal_protos (nor with
# shoal_common, which links them): every Shoal type must come from the server.
add_executable(shoal-reflect-call ${PROJECT_SOURCE_DIR}/tests/support/reflect_call.cc)
target_link_libraries(shoal-reflect-call PRIVATE grpc_reflection_protos gRPC::grpc++
  protobuf::libprotobuf Threads::Threads)
shoal_warnings(shoal-reflect-call)
add_dependencies(reflection_test shoal-reflect-call)
shoal_test(late_join_test integration ${CMAKE_CURRENT_LIST_DIR}/late_join_test.cc
  ${PROJECT_SOURCE_DIR}/tests/support/faulty_peer.cc
  LIBS worker_lib checkpoint_service checkpoint_client)
# The shared coordinator set-up; the peer and checkpoint servers of the
# health-through-reflection tests.
target_link_libraries(coordinator_rpc_test PRIVATE test_coordinator)
target_link_libraries(reflection_test PRIVATE test_coordinator checkpoint_service worker_lib)
# TLS with certificates from scripts/make-certs.sh (the real openssl).
shoal_test(tls_test integration ${CMAKE_CURRENT_LIST_DIR}/tls_test.cc LIBS checkpoint_service)
target_compile_definitions(tls_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# Writes its .pt files with Debian's python3-torch; runs shoal-coordinator.
shoal_test(torchscript_test integration ${CMAKE_CURRENT_LIST_DIR}/torchscript_test.cc
  LIBS worker_trainer worker_torchscript)
target_compile_definitions(torchscript_test PRIVATE SHOAL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# Gossip mode between real peers: whole-model fetches, corrupt / truncated
# transfers, a peer that stops answering.
shoal_test(gossip_peers_test integration ${CMAKE_CURRENT_LIST_DIR}/gossip_peers_test.cc
  ${PROJECT_SOURCE_DIR}/tests/support/faulty_peer.cc LIBS worker_lib)
# GrpcPeerClient's callback calls (manifest retry and cancellation, probe,
# push) against a scripted Peer service.
shoal_test(peer_calls_test integration ${CMAKE_CURRENT_LIST_DIR}/peer_calls_test.cc
  LIBS worker_lib)
# The supernode relay (Coordinator.Relay): a light relay client next to
# direct workers, bad calls, limits, a broken relay.
shoal_test(relay_test integration ${CMAKE_CURRENT_LIST_DIR}/relay_test.cc
  LIBS coordinator_service worker_lib)
target_link_libraries(relay_test PRIVATE test_coordinator)
# The supernode's relay frontend (worker side): real members through it, a
# supernode that dies.
shoal_test(relay_frontend_test integration ${CMAKE_CURRENT_LIST_DIR}/relay_frontend_test.cc
  LIBS coordinator_service worker_lib)
target_link_libraries(relay_frontend_test PRIVATE test_coordinator)
# The coordinator's registered service: the method table covers the proto,
# token then leader check on every method, the join rate, Joins probing a
# silent address while other calls are served.
shoal_test(coordinator_endpoint_test integration
  ${CMAKE_CURRENT_LIST_DIR}/coordinator_endpoint_test.cc LIBS coordinator_service)
target_link_libraries(coordinator_endpoint_test PRIVATE test_coordinator)
# The asynchronous reachability probe against real sockets on 127.0.0.1.
shoal_test(tcp_prober_test integration ${CMAKE_CURRENT_LIST_DIR}/tcp_prober_test.cc
  LIBS shoal_common)
# The worker host and its runners (gossip and synchronous) with a scripted
# coordinator client: no coordinator process.
shoal_test(worker_runner_test integration ${CMAKE_CURRENT_LIST_DIR}/worker_runner_test.cc
  LIBS worker_lib)
# The uplink pacer against real sockets on 127.0.0.1.
shoal_test(uplink_pacer_test integration ${CMAKE_CURRENT_LIST_DIR}/uplink_pacer_test.cc
  LIBS worker_lib)
