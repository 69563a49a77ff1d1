/*
 * Iceberg's own REST catalog server (RESTCatalogServer of iceberg-open-api's test
 * fixtures: its backend catalog, RESTServerCatalogAdapter and RESTCatalogServlet),
 * listening on 127.0.0.1 only. RESTCatalogServer itself binds every interface and has
 * no setting for the host; the rest is its own code, configured as it is
 * (CATALOG_* environment variables: CATALOG_URI, CATALOG_WAREHOUSE, ...).
 * Prints "READY <port>" once it serves requests; stops with the JVM.
 */
package org.apache.iceberg.rest;

import java.lang.reflect.Method;
import java.util.HashMap;
import java.util.Map;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

public final class LoopbackRESTCatalogServer {
  private LoopbackRESTCatalogServer() {}

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    Map<String, String> config = new HashMap<>();
    config.put(RESTCatalogServer.REST_PORT, args[0]);
    RESTCatalogServer fixture = new RESTCatalogServer(config);
    Method init = RESTCatalogServer.class.getDeclaredMethod("initializeBackendCatalog");
    init.setAccessible(true);
    RESTCatalogServer.CatalogContext context =
        (RESTCatalogServer.CatalogContext) init.invoke(fixture);
    RESTCatalogServlet servlet = new RESTCatalogServlet(new RESTServerCatalogAdapter(context));
    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(new ServletHolder(servlet), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost("127.0.0.1");
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(handler);
    server.start();
    System.out.println("READY " + connector.getLocalPort());
    System.out.flush();
    server.join();
  }
}
