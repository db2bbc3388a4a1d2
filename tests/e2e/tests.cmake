# End-to-end: the real binaries as processes on loopback.
shoal_test(cluster_test e2e e2e/cluster_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(cluster_test shoal-coordinator shoal-worker shoalctl)
shoal_test(faults_test e2e e2e/faults_test.cc LIBS shoal_protos shoal_common SERIAL)
add_dependencies(faults_test shoal-coordinator shoal-worker)
